"""An executable's build stored with its plan (runtime.build_tables): an executable built
from stored tables is the one built afresh from the same plan (its steps, slots, bound
buffers, NumPy tiers and arena layout) and gives the same bits, call after call, as the
plan prepared with the cache off; tables that are truncated, damaged, of another format
or runtime version, or that do not fit their plan are rebuilt, never trusted; a plan
running loops stores none.

Cost: ~10 s with the kernels on disk on a loaded 2-core machine (~60 s cold), most of it
the random programs' kernels.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastgrad as fg
import fastgrad.numpy as fnp
import fastgrad.runtime.executable as executable_module
from fastgrad.compiler import plan_cache
from fastgrad.core.config import config
from fastgrad.runtime import background, build_tables, numpy_blocks
from fastgrad.runtime.executable import Executable, StoredBuild, _KernelStep, _MatmulStep
from fastgrad.testing import strategies as fst
from test_plan_cache import (  # the same damages, the same small RNN, the same checks
    RNN_ARGS,
    _check,
    _check_damage_rebuilt,
    _check_other_version_unused,
    _corrupt_payload,
    _empty,
    _one_plan,
    _other_format,
    _random_program,
    _rnn,
    _run_new,
    _same_bits,
    _truncate,
    _value_and_grads,
)


def _build_form(executable: Any) -> list[Any]:
    """What the build computed: each step's kind, slots and bound buffers, its NumPy tier's
    ops, the matmuls' accumulation, and the arena (buffers, spans, offsets, static slots)."""
    form: list[Any] = [len(executable.template), executable.outputs]
    for step in executable.plan:
        row: list[Any] = [type(step).__name__, list(step.ins)]
        if isinstance(step, _KernelStep):
            row += [step.outs, step._buffers, step.sizes, step.nchunks, step.source.source]
            if step.tier is not None:
                loop = step.tier.numpy_loop
                ops = [(op[0], tuple(map(tuple, op[2])), op[3], op[4]) for op in loop.ops]
                dead = [tuple(d) for d in loop.dead]
                row += [ops, list(map(tuple, loop.outputs)), dead, list(loop.into), loop.pooled]
                row += [list(loop.slots), _blocked_form(loop.blocked)]
        elif isinstance(step, _MatmulStep):
            row += [step.out, step.buffer, step.accumulate]
        else:
            row += [getattr(step, "out", None)]
        form.append(row)
    arena = executable.arena
    buffers = [(b.slot, b.shape, b.dtype, b.view_slot, b.first, b.last) for b in arena.buffers]
    views = [(s.ins, s.out) for s in arena.static_views]
    form += [buffers, arena.layout(), sorted(arena.static), arena.copied, views]
    return form


def _blocked_form(blocked: Any) -> Any:
    """What a NumPy tier run by blocks computes with (runtime.numpy_blocks), or None."""
    if blocked is None:
        return None
    ops = [(op[0], op[1], tuple(map(tuple, op[2])), op[3], op[4]) for op in blocked.ops]
    shapes = [tuple(s) for s in blocked.out_shapes]
    outputs = [tuple(o) for o in blocked.outputs]
    head = [blocked.shape, ops, blocked.kinds, blocked.rows, blocked.ufuncs, blocked.dtypes]
    return [*head, shapes, outputs, blocked.buffers]


def _fresh_saved_loaded(plans: Path, f: Any, xs: Any) -> tuple[Any, Any, Any]:
    """`f` prepared with the plan cache off, then twice with it on: the first stores the
    plan and its tables, the second builds its executable from them."""
    for path in plans.iterdir():
        path.unlink()
    config.update("plan_cache", False)
    fresh = fg.jit(f).lower(*xs)
    config.update("plan_cache", True)
    saved = fg.jit(f).lower(*xs)
    before = build_tables.COUNTERS.loaded
    loaded = fg.jit(f).lower(*xs)
    assert build_tables.COUNTERS.loaded == before + 1  # built from the stored tables
    return fresh, saved, loaded


def _check_three(plans: Path, f: Any, xs: Any) -> None:
    fresh, saved, loaded = _fresh_saved_loaded(plans, f, xs)
    # Built from its stored steps, where they have a stored form (runtime.stored_plan).
    assert isinstance(loaded.executable, StoredBuild) == (saved.executable.tables.steps is not None)
    assert _build_form(loaded.executable) == _build_form(saved.executable)
    for _ in range(3):  # the NumPy tier or the kernels, then the lowered plan
        want = fresh.executable(list(xs))
        _same_bits(want, saved.executable(list(xs)))
        _same_bits(want, loaded.executable(list(xs)))


@st.composite
def _recurrences(draw: Any) -> Any:
    """A small unrolled recurrence through matmuls (whose gradients are sums of products
    that BLAS accumulates), transposes, slices and reshapes, with its inputs."""
    steps, batch, width = draw(st.integers(1, 4)), draw(st.integers(1, 3)), draw(st.integers(1, 4))
    transposed, sliced = draw(st.booleans()), draw(st.booleans())
    act = draw(st.sampled_from([fnp.tanh, fnp.sin, lambda z: z * z]))

    def f(w: Any, xs: Any) -> Any:
        h, total = xs[0] * 0.0, 0.0
        for t in range(steps):
            h = act(xs[t] + h @ (w.T if transposed else w))
            kept = h[:, : max(1, width // 2)] if sliced else h
            total = total + fnp.sum(fnp.reshape(kept * kept, (-1,)))
        return total

    def program(w: Any, xs: Any) -> Any:
        value, grads = fg.value_and_grad(f, (0, 1))(w, xs)
        return value, *grads

    dtype = draw(st.sampled_from([np.float32, np.float64]))
    w = draw(fst.arrays((width, width), dtype, "real")) * 0.5
    xs = draw(fst.arrays((steps, batch, width), dtype, "real"))
    return program, (w, xs)


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=_recurrences())
def test_an_executable_from_stored_tables_is_the_fresh_one(plans: Path, case: Any) -> None:
    program, xs = case
    _check_three(plans, program, xs)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@settings(
    max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_stored_tables_of_random_programs(plans: Path, dtype: Any, data: Any) -> None:
    program, xs = _random_program(data, dtype)
    _check_three(plans, _value_and_grads(program), xs)


def _one_table(plans: Path) -> Path:
    (path,) = plans.glob("*.tables")
    return path


@pytest.mark.parametrize("damage", [_corrupt_payload, _truncate, _other_format, _empty])
def test_damaged_tables_are_rebuilt_not_trusted(plans: Path, damage: Any) -> None:
    _check_damage_rebuilt(plans, "tables", build_tables.COUNTERS, damage)


def test_tables_of_another_runtime_are_not_used(
    plans: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    version = (build_tables, "runtime_version")
    _check_other_version_unused(plans, "tables", build_tables.COUNTERS, version, monkeypatch)


def _shifted_slots(tables: Any) -> Any:
    tables.slots = tuple(k + 1 if k >= 0 else k for k in tables.slots)
    return tables


def _fewer_values(tables: Any) -> Any:
    tables.slots = tables.slots[:-1]
    return tables


def _no_folds(tables: Any) -> Any:
    tables.folded = frozenset()
    return tables


def _another_arena(tables: Any) -> Any:
    count, *rest = tables.arena
    tables.arena = (count + 1, *rest)
    return tables


def _buffers_cut(tables: Any) -> Any:
    """The arena's buffers (runs of 5 ints) one int short."""
    count, slots, binds, matmuls, views, (kinds, flat), *rest = tables.arena
    tables.arena = (count, slots, binds, matmuls, views, (kinds, flat[:-1]), *rest)
    return tables


def _other_outputs(tables: Any) -> Any:
    """A loop step's outputs not the step's (a kernel variant writing them in another order)."""
    count, slots, binds, *rest = tables.arena
    (at, bound, ins, outs), *others = binds
    tables.arena = (count, slots, ((at, bound, ins, outs[::-1] + (-1,)), *others), *rest)
    return tables


def _shorter_tier(tables: Any) -> Any:
    """A loop's NumPy tier that lets go of values after fewer ops than the loop has."""
    at, (ins, reuse, outputs, dead, into, passed, slots) = next(iter(sorted(tables.numpy.items())))
    tables.numpy = {**tables.numpy, at: (ins, reuse, outputs, dead[:-1], into, passed, slots)}
    return tables


def _steps_shifted(tables: Any) -> Any:
    """A step reading a slot past the last."""
    *head, rows, arrays = tables.steps
    (code, kind, *own), *others = rows
    tables.steps = (*head, ((code, kind, *own[:-1], own[-1] + 10**6), *others), arrays)
    return tables


def _steps_negative(tables: Any) -> Any:
    """A step reading a slot before the first (a negative index, which Python would read
    from the end)."""
    *head, rows, arrays = tables.steps
    (code, kind, *own), *others = rows
    tables.steps = (*head, ((code, kind, *own[:-1], -1), *others), arrays)
    return tables


def _steps_fewer(tables: Any) -> Any:
    *head, rows, arrays = tables.steps
    tables.steps = (*head, rows[:-1], arrays)
    return tables


def _steps_other_kind(tables: Any) -> Any:
    """A step of another kind of step (a kernel step read as a view, say)."""
    *head, kinds, rows, arrays = tables.steps
    (code, kind, *own), *others = rows
    other = next(k for k, row in enumerate(kinds) if row[0] != code)
    tables.steps = (*head, kinds, ((code, other, *own), *others), arrays)
    return tables


def _steps_other_inputs(tables: Any) -> Any:
    """Stored steps for arguments of another shape."""
    inputs, slots, consts, avals, *rest = tables.steps
    first = avals[inputs[0]]
    avals = (*avals, ((*first[0], 1), *first[1:]))
    tables.steps = ((len(avals) - 1, *inputs[1:]), slots, consts, avals, *rest)
    return tables


def _steps_shorter_tier(tables: Any) -> Any:
    """A kernel step's NumPy tier that lets go of values after fewer ops than it has."""
    *head, kinds, rows, arrays = tables.steps
    k, row = next((k, row) for k, row in enumerate(kinds) if row[0] == 0)
    ops, (ins, reuse, outputs, dead, into, passed), shape = row[6]
    row = (*row[:6], (ops, (ins, reuse, outputs, dead[:-1], into, passed), shape), row[7])
    tables.steps = (*head, (*kinds[:k], row, *kinds[k + 1 :]), rows, arrays)
    return tables


def _steps_pass_another_op(tables: Any) -> Any:
    """A kernel step's NumPy tier that leaves to its readers an op that is no broadcast."""
    *head, kinds, rows, arrays = tables.steps
    k, row = next((k, row) for k, row in enumerate(kinds) if row[0] == 0)
    ops, (ins, reuse, outputs, dead, into, passed), shape = row[6]
    other = next(i for i, (name, _, _) in enumerate(ops) if name != "broadcast_to")
    program = (ins, reuse, outputs, dead, into, (*passed, other))
    row = (*row[:6], (ops, program, shape), row[7])
    tables.steps = (*head, (*kinds[:k], row, *kinds[k + 1 :]), rows, arrays)
    return tables


@pytest.mark.parametrize(
    "change",
    [
        _steps_shifted,
        _steps_negative,
        _steps_fewer,
        _steps_other_kind,
        _steps_other_inputs,
        _steps_shorter_tier,
    ]
    + [_steps_pass_another_op, _another_arena, _other_outputs, _buffers_cut],
)
def test_stored_steps_that_do_not_fit_are_rebuilt(plans: Path, change: Any) -> None:
    """An executable's stored steps (runtime.stored_plan) with a valid digest that do not
    fit: rebuilt from the plan, never trusted."""
    _check_unfit_rebuilt(plans, change)


@pytest.mark.parametrize(
    "change",
    [_shifted_slots, _fewer_values, _no_folds, _another_arena, _other_outputs, _shorter_tier],
)
def test_whole_tables_that_do_not_fit_are_rebuilt(
    plans: Path, change: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tables with a valid digest that do not fit the plan they are read for (tables
    without stored steps, as a plan whose NumPy tier runs by blocks has)."""
    monkeypatch.setattr(executable_module, "describe", lambda *args: None)
    _check_unfit_rebuilt(plans, change)


def _check_unfit_rebuilt(plans: Path, change: Any) -> None:
    _check(_run_new())
    path = _one_table(plans)
    whole = path.read_bytes()
    key = path.stem
    stored = plan_cache.load_kind(key, "tables", build_tables.Tables.decode, plan_cache.Counters())
    assert stored is not None
    plan_cache.save_kind(key, "tables", change(stored).encode, plan_cache.Counters())
    assert path.read_bytes() != whole
    _check(_run_new())
    assert (build_tables.COUNTERS.dropped, build_tables.COUNTERS.saved) == (1, 2)
    assert path.read_bytes() == whole  # rebuilt and stored again


def test_plans_running_loops_store_no_tables(plans: Path) -> None:
    def f(w: Any, xs: Any) -> Any:
        def body(h: Any, x: Any) -> Any:
            h = fnp.tanh(x + h @ w)
            return h, fnp.sum(h)

        _, ys = fg.scan(body, xs[0] * 0.0, xs)
        return fnp.sum(ys)

    # (Such a plan is not stored either: a loop body has no plain form. The executable
    # would not give tables for it if it were.)
    plan = fg.jit(fg.value_and_grad(f)).lower(*RNN_ARGS).executable
    assert Executable(plan.graph, plan.steps, record=True).tables is None
    got = fg.jit(fg.value_and_grad(f))(*RNN_ARGS)
    assert not list(plans.glob("*.tables"))
    want = fg.jit(fg.value_and_grad(f), fuse=False)(*RNN_ARGS)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12)


def test_a_warm_executable_reads_no_plan_until_asked(plans: Path) -> None:
    """Built from its stored steps, the executable reads no plan (its graph, partition and
    kernel sources) until something asks, not even once its kernels are settled and its
    calls lowered: then the stored plan's, as a cold build has."""
    _check(_run_new())
    jf = fg.jit(fg.value_and_grad(_rnn))
    executable = jf.lower(*RNN_ARGS).executable
    assert isinstance(executable, StoredBuild)
    fg.warmup(jf, *RNN_ARGS)
    for _ in range(3):
        _same_bits(jf(*RNN_ARGS), _run_new())
    assert not {"graph", "steps", "generated", "_stored"} & set(executable.__dict__)
    config.update("plan_cache", False)
    cold = fg.jit(fg.value_and_grad(_rnn)).lower(*RNN_ARGS).executable
    config.update("plan_cache", True)
    assert str(executable.graph) == str(cold.graph)
    assert len(executable.steps) == len(cold.steps)
    assert [s.source for s in executable.generated.values()] == [
        s.source for s in cold.generated.values()
    ]
    for step in executable.plan:  # (runtime.explain pairs a kernel step with its loop)
        if isinstance(step, _KernelStep):
            assert step.loop in executable.steps


def test_a_warm_executable_without_its_plan_file(plans: Path) -> None:
    """Its plan file gone (evicted, say), the stored steps still build the executable;
    asked for its graph, it prepares the traced graph again."""
    _check(_run_new())
    _one_plan(plans).unlink()
    executable = fg.jit(fg.value_and_grad(_rnn)).lower(*RNN_ARGS).executable
    assert isinstance(executable, StoredBuild)
    _check(executable(list(RNN_ARGS)))
    assert len(executable.graph.nodes) > 0 and executable.steps


class _Held:
    """The compile thread, never run: every loop stays on its NumPy tier."""

    def submit(self, job: Any) -> None:
        pass


def test_a_tier_run_by_blocks_is_stored_with_its_steps(
    plans: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A NumPy tier run by blocks (blocks of 8 elements here) is stored with the steps:
    built warm as cold, and on NumPy (kernels held back) the same bits."""
    monkeypatch.setattr(numpy_blocks, "BLOCK", 8)
    monkeypatch.setattr(background, "_WORKER", _Held())
    monkeypatch.setattr(fg.config, "compile", "background")

    def f(w: Any, x: Any) -> Any:
        return fnp.sum(fnp.tanh(x * w + fnp.sin(x)) * fnp.exp(-w * w))

    program = fg.value_and_grad(f, (0, 1))
    rng = np.random.default_rng(3)
    xs = (rng.standard_normal((64, 4)), rng.standard_normal((64, 4)))
    fresh, saved, loaded = _fresh_saved_loaded(plans, program, xs)
    assert isinstance(loaded.executable, StoredBuild)
    tiers = [s.tier for s in loaded.executable.plan if getattr(s, "tier", None)]
    assert any(t.numpy_loop.blocked is not None for t in tiers)
    assert _build_form(loaded.executable) == _build_form(saved.executable)
    for _ in range(2):
        want = fresh.executable(list(xs))
        _same_bits(want, saved.executable(list(xs)))
        _same_bits(want, loaded.executable(list(xs)))
    assert all(s.tier is not None for s in loaded.executable.plan if hasattr(s, "tier"))
