"""What fastgrad says while it compiles: the one-line notice when kernels are built, and
with FASTGRAD_LOG_COMPILES every trace and compile with the reason (which argument changed,
and how)."""

import io
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.core import compile_log


@pytest.fixture
def log(monkeypatch, capsys):
    """Turn compile logging on; the fixture's value reads what was logged since last read."""
    monkeypatch.setattr(fg.config, "log_compiles", True)
    return lambda: capsys.readouterr().err


def lines(text, word):
    return [line for line in text.splitlines() if line.startswith(f"fastgrad: {word}")]


def test_every_trace_says_what_changed(log):
    f = fg.jit(lambda x, n: fnp.sum(x**n), static_argnames="n")
    f(np.ones((4, 3)), n=2)
    (trace,) = lines(log(), "tracing")
    assert trace == "fastgrad: tracing <lambda>(x: f64[4,3]): first call"
    changes = [
        ((np.ones((4, 3), np.float32),), {"n": 2}, "x: dtype float64 -> float32"),
        ((np.ones((4, 3, 1)),), {"n": 2}, "x: rank 2 -> 3 (shape (4, 3) -> (4, 3, 1))"),
        ((np.ones((1, 3)),), {"n": 2}, "x: shape (4, 3) -> (1, 3), a new shape class"),
        ((np.ones((8, 3)),), {"n": 2}, "x: shape (4, 3) -> (8, 3) (same shape class: kernels"),
        ((np.ones((4, 3)),), {"n": 3}, "static argument n: 2 -> 3"),
        ((2.0,), {"n": 3}, "x: array -> Python scalar; x: rank 2 -> 0"),
    ]
    for args, kwargs, reason in changes:
        f(*args, **kwargs)
        (trace,) = lines(log(), "tracing")
        assert reason in trace, (reason, trace)
    f(np.ones((4, 3)), n=3)  # seen before: no trace, no compile
    assert log() == ""


def test_a_compile_is_logged_and_new_strides_say_so(log):
    f = fg.jit(lambda x: fnp.sum(fnp.exp(x) * x))
    f(np.ones((4, 6)))
    (compiled,) = lines(log(), "compiled")
    assert compiled.startswith("fastgrad: compiled <lambda>(x: f64[4,6]): 1 kernel (")
    f(np.ones((8, 6))[::2])  # same shape and dtype, other strides: Numba types it anew
    text = log()
    assert not lines(text, "tracing")
    (compiled,) = lines(text, "compiled")
    assert compiled.endswith("x: strides changed (C-contiguous -> strided)")
    f(np.ones((4, 12))[:, ::2])  # other strides, same layout class: nothing new
    assert log() == ""


def test_transforms_and_the_config_switch(log):
    f = fg.jit(lambda x: fnp.sum(x * x))
    fg.grad(f)(np.ones(3))
    assert lines(log(), "tracing") == ["fastgrad: tracing grad(<lambda>)(x: f64[3]): first call"]
    fg.config.update("log_compiles", False)
    fg.grad(f)(np.ones(4))
    assert log() == ""
    with pytest.raises(AttributeError, match="no setting 'log_compile'.*log_compiles"):
        fg.config.update("log_compile", True)


def notice_output(tty, n_kernels, n_built=None):
    stream = io.StringIO()
    stream.isatty = lambda: tty
    with pytest.MonkeyPatch.context() as m:
        m.setattr(compile_log, "_stream", lambda: stream)
        with compile_log.compiling("loss(x: f64[3])", n_kernels):
            for _ in range(n_kernels if n_built is None else n_built):
                compile_log.kernel_built()
    return stream.getvalue()


def test_the_notice_is_one_line_with_progress():
    text = notice_output(tty=False, n_kernels=3)
    assert text.count("\n") == 1 and text.endswith(" s\n")
    assert text.startswith("fastgrad: compiling loss(x: f64[3]): 3 kernels (cached in ")
    assert "for next time) ... done in" in text
    text = notice_output(tty=True, n_kernels=3)  # a terminal: a count, rewritten in place
    assert text.count("\n") == 1 and text.count("\r") == 3 and " 3/3 done in " in text
    assert notice_output(tty=False, n_kernels=0) == ""  # nothing to build: nothing said
    # A kernel built twice (two memory layouts) does not push the count past the total.
    assert " 3/3 done in " in notice_output(tty=True, n_kernels=3, n_built=5)
    assert "time) ... done in" in notice_output(tty=False, n_kernels=3, n_built=5)


SCRIPT = textwrap.dedent(
    """
    import numpy as np, fastgrad as fg, fastgrad.numpy as fnp
    print(fg.jit(lambda x: fnp.sum(fnp.cosh(x) * 3.5))(np.ones(5)))
    """
)


def test_a_new_process_says_it_compiles_then_loads_quietly(tmp_path):
    env = dict(os.environ, FASTGRAD_CACHE_DIR=str(tmp_path))
    env.pop("FASTGRAD_COMPILE_NOTICE", None)

    def run(**extra):
        return subprocess.run(
            [sys.executable, "-c", SCRIPT],
            env={**env, **extra},
            capture_output=True,
            text=True,
            check=True,
        )

    first = run()
    assert first.stderr.startswith("fastgrad: compiling <lambda>(x: f64[5]): 1 kernel (cached")
    assert str(tmp_path) in first.stderr and first.stderr.count("\n") == 1
    assert run().stderr == ""  # cached: nothing to say
    logged = run(FASTGRAD_LOG_COMPILES="1").stderr
    assert "fastgrad: tracing <lambda>(x: f64[5]): first call" in logged
    assert "1 kernel (0 built, 1 cached)" in logged


def test_the_notice_can_be_turned_off(tmp_path):
    env = dict(os.environ, FASTGRAD_CACHE_DIR=str(tmp_path), FASTGRAD_COMPILE_NOTICE="0")
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True
    )
    assert out.stderr == ""
