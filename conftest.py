"""The test session's kernel cache is never the user's.

Unless FASTGRAD_CACHE_DIR already names a directory (each developer's own, say), every
test, doctest and subprocess the tests start caches kernels in a per-user directory under
the system's temporary directory, kept between runs so that a second run compiles
nothing. Tests of the default location point HOME at a temporary directory of their own
(tests/test_kernel_cache.py). Kernels compile before a first call returns
(FASTGRAD_COMPILE=sync), so that every run takes the same path; tests of the background
tier switch it on themselves (tests/test_tiers.py). Traced graphs are type-checked
(FASTGRAD_CHECK_GRAPHS=1). Doctests see `np`, `fg` and `fnp`, as
a user's session would, so that an example can show a derivative in one line.
"""

import getpass
import os
import tempfile
from pathlib import Path

import pytest

TEST_CACHE = Path(tempfile.gettempdir()) / f"fastgrad-test-cache-{getpass.getuser()}"


def pytest_configure(config):
    if not os.environ.get("FASTGRAD_CACHE_DIR"):
        os.environ["FASTGRAD_CACHE_DIR"] = str(TEST_CACHE)
    os.environ.setdefault("FASTGRAD_COMPILE", "sync")
    # Every traced graph type-checked node by node (off by default: tracing gives each
    # node its rule's type, and the check cost a 200-step RNN's warm first call ~25 ms).
    os.environ.setdefault("FASTGRAD_CHECK_GRAPHS", "1")


@pytest.fixture(autouse=True)
def _doctest_names(request):
    # Doctests only; imported here, not at the top: pytest_configure sets the cache first.
    if isinstance(request.node, pytest.DoctestItem):
        import numpy

        import fastgrad
        import fastgrad.numpy

        names = request.getfixturevalue("doctest_namespace")
        names.update(np=numpy, fg=fastgrad, fnp=fastgrad.numpy)
