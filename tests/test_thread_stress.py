"""Random programs run from several threads at once give the bits one thread gets.

Hypothesis draws a few random differentiable programs and their inputs; each is run in
one thread first (value and gradient, un-jitted and jitted), then from several threads
together, in a different order in each thread, on functions jitted anew so that the
threads trace them at once. Jitted here means on the reference interpreter: a fused
kernel per random program would compile for minutes; fused kernels called from threads
are tested in tests/test_threads.py.
"""

import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.testing import strategies as fst

THREADS = 4


def program_and_inputs():
    return fst.programs(max_steps=5).flatmap(
        lambda p: st.tuples(
            st.just(p), st.tuples(*(fst.arrays(s, np.float64, "real") for s in p.shapes))
        )
    )


def scalar(program):
    return lambda *xs: fnp.sum(program(*xs))


def transforms(program):
    """The ways each program is called: name -> function of the inputs."""
    argnums = tuple(range(len(program.shapes)))
    vg = fg.value_and_grad(scalar(program), argnums=argnums)
    return {"value_and_grad": vg, "jit": fg.jit(vg, fuse=False)}


def bits(result) -> bytes:
    value, grads = result
    return np.asarray(value).tobytes() + b"".join(np.asarray(g).tobytes() for g in grads)


@given(st.lists(program_and_inputs(), min_size=2, max_size=3))
def test_random_programs_from_threads(cases):
    expected = {}
    for k, (program, xs) in enumerate(cases):
        for name, f in transforms(program).items():
            expected[k, name] = bits(f(*xs))
    shared = {k: transforms(program) for k, (program, _) in enumerate(cases)}
    calls = [(k, name) for k in shared for name in shared[k]]
    start = threading.Barrier(THREADS)

    def work(t: int) -> list[tuple[tuple[int, str], bytes]]:
        order = np.random.default_rng(t).permutation(len(calls))
        start.wait()
        out = []
        for _ in range(2):
            for i in order:
                k, name = calls[i]
                out.append(((k, name), bits(shared[k][name](*cases[k][1]))))
        return out

    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        with ThreadPoolExecutor(THREADS) as pool:
            results = [r for chunk in pool.map(work, range(THREADS)) for r in chunk]
    finally:
        sys.setswitchinterval(before)
    assert len(results) == 2 * THREADS * len(calls)
    wrong = [key for key, got in results if got != expected[key]]
    assert not wrong, f"{len(wrong)} of {len(results)} calls differ: {wrong[:5]}"
