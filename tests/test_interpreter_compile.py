"""What compiles, cold, for the plan interpreter (runtime.vm) and the products it cuts
(runtime.gemm_split): counted in a fresh process with an empty cache,
not timed. The interpreter's loop, which every plan needs, compiled the cut into itself
(15 s of CPU cold, 2.2 s before the cut learnt to pair products); the cut's helpers were
compiled once per constant argument as well as inlined. (~4 s: one child process.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = """
import json
from numba.core import compiler
from fastgrad.runtime import numba_load

numba_load.load(None)
names = []
compile_extra = compiler.compile_extra


def counted(typingctx, targetctx, func, args, *rest, **options):
    names.append(func.__name__)
    return compile_extra(typingctx, targetctx, func, args, *rest, **options)


compiler.compile_extra = counted  # every Numba compile (dispatchers, C functions) ends here
from fastgrad.runtime import gemm_split, vm

vm.table_function()
loop = list(names)
names.clear()
gemm_split.rows_function()
print(json.dumps({"loop": loop, "cut": names}))
"""


def test_the_interpreters_loop_compiles_without_the_cut_and_helpers_once(tmp_path: Path) -> None:
    env = dict(os.environ, FASTGRAD_CACHE_DIR=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True
    )
    compiled = json.loads(done.stdout.strip().splitlines()[-1])
    loop, cut = compiled["loop"], compiled["cut"]
    assert "_run_table" in loop and "_run_loop" in loop
    assert not {"pair", "product"} & set(loop), loop  # the cut is a C function of its own
    assert {"_rows", "pair", "product", "_share", "_span"} <= set(cut), cut
    # each helper of the cut once, whatever constants its callers pass (not 2-4 times)
    helpers = [name for name in cut if name.startswith("_") and name != "_rows"]
    assert len(helpers) == len(set(helpers)), sorted(helpers)
