"""Products handed to the product cut's worker without waiting (runtime.plan_posts, the
interpreter's POST and JOIN rows, gemm_split.post and join): the JOIN comes before the
first row that reads what a posted product writes or writes what it reads (bytes of
buffers, views of them, arrays allocated per call, arguments), the caller runs a posted
product the worker has not started, programs keep the step runner's bits, and a process
that may run on one CPU posts nothing.

Products are not cut into bands here (PIECES 1): posting computes each product whole,
and bands' bits are test_runtime_gemm_split's business."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.runtime import gemm_split, plan_posts, plan_table, vm
from fastgrad.runtime.blas import blas_address, region_address
from fastgrad.runtime.plan_table import Segment
from fastgrad.runtime.vm_rows import GEMM, JOIN, KERNEL, POST
from test_runtime_gemm_split import (  # noqa: F401 - a fixture
    _layout,
    _offsets,
    _wait_ready,
    pytestmark,
    split,
)
from test_runtime_vm import _jitted, sync  # noqa: F401 - a fixture


@pytest.fixture
def posting(split: np.ndarray, monkeypatch: pytest.MonkeyPatch) -> Iterator[np.ndarray]:  # noqa: F811
    """Every product a candidate, posted wherever it may be, never cut into bands."""
    before = split.copy()
    split[gemm_split.MIN_WORK], split[gemm_split.PIECE_WORK] = 1, 16
    split[gemm_split.PIECES] = 1
    monkeypatch.setattr(plan_posts, "LEAST_SHARE", 0.0)
    yield split
    for entry in (gemm_split.MIN_WORK, gemm_split.PIECE_WORK, gemm_split.PIECES):
        split[entry] = before[entry]


@contextmanager
def asleep(state: np.ndarray) -> Iterator[None]:
    """A worker that never wakes: its thread stopped, the state still saying it serves.
    Whatever is posted meanwhile the caller runs at the join."""
    settings = state.copy()
    gemm_split.stop()
    for entry in (gemm_split.MIN_WORK, gemm_split.PIECE_WORK, gemm_split.PIECES):
        state[entry] = settings[entry]
    state[gemm_split.READY] = 1
    try:
        yield
    finally:
        state[gemm_split.READY] = 0
        gemm_split.state_address()  # serves again (the posts it missed find no claim)
        _wait_ready(state)
        for entry in (gemm_split.MIN_WORK, gemm_split.PIECE_WORK, gemm_split.PIECES):
            state[entry] = settings[entry]


# ------------------------------------------------------------------ where JOINs go


def _gemm(m: int, n: int, k: int) -> list[int]:
    """A GEMM row the worker may take (its split set), as plan_posts reads it."""
    return [GEMM, 0, 1, 2, 0, 0, 0, m, n, k, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]


def _placed(rows: list[tuple[str, list[int], list[int]]], env: list[Any], **kinds: Any) -> str:
    """The order plan_posts gives `rows` ((kind "gemm" or "kernel", slots read, slots
    written), one segment; every slot static unless `kinds` names it fresh, private or a
    view of another), as a string: G, P (posted), K, J."""
    table = SimpleNamespace(code=[], starts=[], effects={}, env=env, static=set(range(len(env))))
    for kind, reads, writes in rows:
        start = len(table.code)
        table.code += _gemm(64, 64, 64) if kind == "gemm" else [KERNEL]
        work = 64**3 if kind == "gemm" else 100
        table.effects[start] = plan_posts.Effect(reads, writes, work)
        table.starts.append(start)
    fresh = [(None, None, 0, None, slot, False) for slot in kinds.get("fresh", ())]
    views = {out: (source, None) for out, source in kinds.get("views", {}).items()}
    table.static -= {*kinds.get("fresh", ()), *kinds.get("private", ()), *views}
    segment = SimpleNamespace(first=0, count=len(rows), views=views, fresh=fresh)
    plan_posts.place(table, [segment], set(kinds.get("private", ())))
    names = {GEMM: "G", POST: "P", KERNEL: "K", JOIN: "J"}
    return "".join(names[table.code[s]] for s in table.starts[: segment.count])


def test_the_join_comes_before_what_reads_or_overwrites_the_product(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """c = a @ b posted: the kernels after it that touch other buffers run meanwhile; the
    JOIN comes before the first that reads c, writes c, writes a or b (in place), or
    writes bytes of a that another slot views (a buffer's bytes by address); none where
    nothing after needs it (the segment's end waits)."""
    monkeypatch.setattr(plan_posts, "LEAST_SHARE", 0.0)
    block = np.zeros(4096, np.float32)
    a, b, c, d, e = (block[i * 512 : (i + 1) * 512] for i in range(5))
    overlapping_a = block[256:768]  # the second half of a, the first of b
    env = [a, b, c, d, e, overlapping_a]
    product = ("gemm", [0, 1], [2])
    unrelated = ("kernel", [3], [4])
    assert _placed([product, unrelated, unrelated], env) == "PKK"
    assert _placed([product, unrelated, ("kernel", [2], [4])], env) == "PKJK"
    assert _placed([product, unrelated, ("kernel", [3], [2])], env) == "PKJK"
    assert _placed([product, unrelated, ("kernel", [3], [0])], env) == "PKJK"  # in place
    assert _placed([product, ("kernel", [3], [1]), unrelated], env) == "PJKK"
    assert _placed([product, unrelated, ("kernel", [3], [5])], env) == "PKJK"
    assert _placed([product, unrelated, ("kernel", [5], [4])], env) == "PKK"  # reads a
    # a view of c (made in the segment): reading it is reading c
    assert _placed([product, unrelated, ("kernel", [6], [4])], [*env, None], views={6: 2}) == (
        "PKJK"
    )


def test_what_may_share_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Arrays allocated per call share no byte with anything else; arguments none with
    the arena's buffers; anything else read from outside may be anywhere."""
    monkeypatch.setattr(plan_posts, "LEAST_SHARE", 0.0)
    env = [np.zeros(64, np.float32) for _ in range(6)]
    product = ("gemm", [0, 1], [2])
    writes_buffer = ("kernel", [3], [4])
    assert _placed([product, writes_buffer], env, private=[0]) == "PK"
    assert _placed([product, writes_buffer], env, private=[1]) == "PK"
    assert _placed([product, writes_buffer], env, private=[]) == "PK"  # all static, apart
    env[0] = env[1] = None  # read from outside, not arguments: may be the buffer at 4
    assert _placed([product, writes_buffer], env, private=[5]) == "PJK"
    assert _placed([product, ("kernel", [3], [5])], env, fresh=[2, 5]) == "PK"
    assert _placed([product, ("kernel", [5], [3])], env, fresh=[2, 5]) == "PJK"
    assert _placed([product, ("kernel", [2], [3])], env, fresh=[2]) == "PJK"


def test_one_posted_product_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cut's state holds one job: a second product waits for the first one there
    if the first had its share of work meanwhile (3 kernels: not half a product), else
    runs whole on the caller. Of two independent products side by side, the one read
    later is posted."""
    env = [np.zeros(64, np.float32) for _ in range(9)]
    first, second = ("gemm", [0, 1], [2]), ("gemm", [0, 1], [3])
    kernels = [("kernel", [5], [6])] * 3
    monkeypatch.setattr(plan_posts, "LEAST_SHARE", 0.0)
    assert _placed([first, *kernels, second, *kernels], env) == "PKKKJPKKK"
    monkeypatch.setattr(plan_posts, "LEAST_SHARE", 0.5)  # 3 kernels of 100 < 64^3 / 2
    assert _placed([first, *kernels, second, *kernels], env) == "PKKKGKKK"
    reads_second = ("kernel", [3], [7])  # (posting the second would join before it)
    assert _placed([first, second, reads_second, *kernels], env) == "PGKKKK"
    assert _placed([second, first, reads_second, *kernels], env) == "PGKKKK"


# ------------------------------------------------------------------ the rows at run time


def _placed_table(products: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> Any:
    """An interpreter table of GEMM rows c = a @ b in order (operand slots 3i, 3i + 1,
    3i + 2: the arrays, as buffers at fixed addresses), placed by plan_posts; a run of
    it. The second is never cut nor posted (like a product under 2^21 multiply-adds):
    it is a step that runs on the caller while the first may be posted."""
    arrays = [x for product in products for x in product]
    table = SimpleNamespace(code=[], starts=[], effects={}, env=arrays, static=set())
    table.static = set(range(len(arrays)))
    for i, (a, b, c) in enumerate(products):
        (ta, lda), (tb, ldb) = _layout(a), _layout(b)
        m, k, n = *a.shape, b.shape[1]
        params = [int(c.dtype == np.float64), ta, tb, m, n, k, lda, ldb, c.shape[1], 0]
        table.effects[len(table.code)] = plan_posts.Effect(
            [3 * i, 3 * i + 1], [3 * i + 2], m * n * k
        )
        table.starts.append(len(table.code))
        cut = -1 if i == 1 else 2
        table.code += [GEMM, 0, 1, cut, *params, 3 * i, 3 * i + 1, 3 * i + 2, 1, 0, 0, 0]
    segment = SimpleNamespace(first=0, count=len(products), views={}, fresh=[])
    plan_posts.place(table, [segment], set())
    dtype = products[0][2].dtype
    functions = [blas_address("gemm", dtype), blas_address("syrk", dtype)]
    functions.append(gemm_split.state_address())
    count = len(arrays)
    record = [0, segment.count, count, *range(count)]
    packed, at = vm.pack(table.code, table.starts, functions, count, [], [record], region_address())
    return lambda: vm.run_steps(packed, at[0], tuple(arrays))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_posted_products_input_overwritten_after_its_join(
    posting: np.ndarray, dtype: Any
) -> None:
    """c = a @ b posted, then x @ y written into a, then c @ b: plan_posts puts the JOIN
    before the second (it overwrites what the first reads). With a worker that never
    wakes the caller runs the posted product at the JOIN (the claim it never took): a
    JOIN after the overwrite would give c = (x @ y) @ b."""
    rng = np.random.default_rng(7)
    a, x, y, b = rng.standard_normal((4, 64, 64)).astype(dtype)
    expected, original = a @ b, a.copy()
    c, e = np.empty((64, 64), dtype), np.empty((64, 64), dtype)
    run = _placed_table([(a, b, c), (x, y, a), (c, b, e)])
    with asleep(posting):
        posts, stolen = posting[gemm_split.POSTS], posting[gemm_split.STOLEN]
        run()  # (the first and the third posted)
        assert posting[gemm_split.POSTS] == posts + 2
        assert posting[gemm_split.STOLEN] == stolen + 2
    assert np.array_equal(c, expected)
    assert np.array_equal(a, x @ y)
    assert np.array_equal(e, expected @ b)
    a2 = original
    c2, e2 = np.empty_like(c), np.empty_like(e)
    _placed_table([(a2, b, c2), (x, y, a2), (c2, b, e2)])()  # the worker awake
    assert np.array_equal(c2, expected) and np.array_equal(e2, e)


# ------------------------------------------------------------------ whole programs


def _mlp(x: Any, w1: Any, w2: Any) -> Any:
    h = fnp.tanh(x @ w1)
    return fnp.sum((h @ w2) ** 2) + fnp.sum(fnp.exp(-h * h))


def _posts_in(jf: Any, args: Any) -> int:
    arena = jf.lower(*args).executable.arena
    codes = 0
    for call in arena.calls:
        if isinstance(call, Segment):
            table = call.array
            rows = [table[table[0] + i] for i in range(call.first, call.first + call.count)]
            codes += sum(table[p] == POST for p in rows)
    return codes


@pytest.mark.usefixtures("sync")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_programs_posted_products_keep_the_step_runners_bits(
    posting: np.ndarray, dtype: Any
) -> None:
    """An MLP's value and gradients: the weight gradients are posted (and joined at the
    segment's end), with the worker awake or never waking; the step runner's bits."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((96, 64)).astype(dtype)
    w1, w2 = (
        (0.1 * rng.standard_normal((64, 64))).astype(dtype),
        (0.1 * rng.standard_normal((64, 32))).astype(dtype),
    )
    vg = fg.value_and_grad(_mlp, argnums=(0, 1, 2))
    expected = _jitted(vg, "steps")(x, w1, w2)
    g = _jitted(vg, "vm")
    g(x, w1, w2)
    assert _posts_in(g, (x, w1, w2)) >= 2
    posts = posting[gemm_split.POSTS]
    got = g(x, w1, w2)
    assert posting[gemm_split.POSTS] >= posts + 2
    with asleep(posting):
        stolen = posting[gemm_split.STOLEN]
        late = g(x, w1, w2)
        assert posting[gemm_split.STOLEN] >= stolen + 2
    for e, c, d in zip(
        [expected[0], *expected[1]], [got[0], *got[1]], [late[0], *late[1]], strict=True
    ):
        assert np.array_equal(np.asarray(e), np.asarray(c))
        assert np.array_equal(np.asarray(e), np.asarray(d))


@pytest.mark.usefixtures("sync")
def test_one_cpu_posts_nothing(posting: np.ndarray, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that may run on one CPU cuts and posts no product."""
    monkeypatch.setattr(plan_table, "cuts_products", lambda: False)
    rng = np.random.default_rng(9)
    x, w1, w2 = (
        rng.standard_normal((96, 64)),
        rng.standard_normal((64, 64)),
        rng.standard_normal((64, 32)),
    )
    g = _jitted(fg.value_and_grad(_mlp, argnums=(1, 2)), "vm")
    g(x, w1, w2)
    g(x, w1, w2)
    assert _posts_in(g, (x, w1, w2)) == 0


_UNARY = {"tanh": fnp.tanh, "exp": lambda v: fnp.exp(-v * v), "scale": lambda v: 0.5 * v}


@pytest.mark.usefixtures("sync")
@settings(
    max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_random_programs_keep_the_step_runners_bits(posting: np.ndarray, data: Any) -> None:
    """Random programs of 32 x 32 values: products of any two values, serial kernels
    between (elementwise, sums of rows), every value an output; the interpreter, which
    posts what it may, gives the step runner's bits."""
    ops = data.draw(
        st.lists(
            st.tuples(
                st.sampled_from(["matmul", "add", *_UNARY]), st.integers(0, 99), st.integers(0, 99)
            ),
            min_size=3,
            max_size=9,
        )
    )

    def program(*inputs: Any) -> Any:
        values = list(inputs)
        for op, i, j in ops:
            u, v = values[i % len(values)], values[j % len(values)]
            if op == "matmul":
                values.append(u @ v)
            elif op == "add":
                values.append(u + fnp.sum(v, axis=0))
            else:
                values.append(_UNARY[op](u))
        return tuple(values[len(inputs) :])

    dtype = data.draw(st.sampled_from([np.float32, np.float64]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    inputs = [(0.3 * rng.standard_normal((32, 32))).astype(dtype) for _ in range(3)]
    expected = _jitted(program, "steps")(*inputs)
    g = _jitted(program, "vm")
    g(*inputs)
    for e, c in zip(expected, g(*inputs), strict=True):
        assert np.array_equal(np.asarray(e), np.asarray(c))


def _deep_mlp(ws: Any, x: Any) -> Any:
    h = x
    for w in ws:
        h = fnp.tanh(h @ w)
    return fnp.sum(h * h)


@pytest.mark.usefixtures("sync")
def test_posting_keeps_the_arena_of_the_step_runner(posting: np.ndarray) -> None:
    """Posted products keep no buffer alive longer (their JOIN goes before the first
    writer of their bytes): a 6-layer MLP's gradient lays out its arena in as many bytes
    under the interpreter as under the step runner (it took ~1.7x when every big
    product's operands lived until its output's first reader)."""
    rng = np.random.default_rng(10)
    ws = [(0.05 * rng.standard_normal((64, 64))).astype(np.float32) for _ in range(6)]
    x = rng.standard_normal((128, 64)).astype(np.float32)
    vg = fg.value_and_grad(_deep_mlp)
    sizes = {}
    for runtime in ("steps", "vm"):
        jf = _jitted(vg, runtime)
        jf(ws, x)
        sizes[runtime] = jf.lower(ws, x).executable.arena.layout()[1]
    assert sizes["vm"] == sizes["steps"]
