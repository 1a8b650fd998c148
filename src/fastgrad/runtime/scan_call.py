"""A scan whose LOOP row is built (runtime.loop_table), called with the least Python.

The general path of a scan's call goes through layers each written for every case
(LoopStep._run's body arenas and partials, loop_hoisting.HoistedScan.run, scan_loop's
conversions and stacked outputs, ScanLoop.run): ~25 us of Python around a LOOP, where a
value-only scan of 200 short steps runs ~36 us in the interpreter, so that fastgrad's own
unrolled program (one segment) was faster (0.65-0.90x the scan's time). Once the LOOP's
program is built, `ThinScan` does the same work in one function whose every choice was
made when it was built: the products of stacked inputs before the loop, the stacked
outputs (kept in the scan's StackPool as before), the LOOP's call, the sums after it.
It gives the general path's bits (the same NumPy calls and the same LOOP), and returns
None, having changed nothing the caller sees, wherever the general path would have done
anything else (an argument that is not an array of the traced dtype, a layout the LOOP
was not built for): the caller then takes the general path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fastgrad.core.ir import Aval
from fastgrad.runtime import loop_table
from fastgrad.runtime.loop_hoisting import HoistedScan
from fastgrad.transforms.scan import ScanCall, shifted_outputs


class ThinScan:
    """The call of scan `call` (run as `hoisted` when loop_hoisting changed it) whose
    LOOP is `looped` (a loop_table.ScanLoop with its program built); `empty(k, aval)`
    gives stacked output k (LoopStep's StackPool), `private` the stacked outputs no
    caller sees (LoopStep.publish)."""

    def __init__(
        self,
        call: ScanCall,
        hoisted: HoistedScan | None,
        looped: Any,
        empty: Callable[[int, Aval], np.ndarray],
        private: frozenset[int],
    ):
        self.looped, self.empty, self.hoisted = looped, empty, hoisted
        self.dtypes = [a.dtype for a in call.input_avals()]
        self.nc, self.ncar = call.n_consts, call.n_carry
        inner = call if hoisted is None else hoisted.inner
        n_ys = len(call.body.outputs) - call.n_carry
        if hoisted is not None:  # the added stacks are the inner scan's last outputs
            private = frozenset({*private, *range(n_ys, n_ys + hoisted.n_added)})
            summed = {s.carry for s in hoisted.sums}
            self.kept = [k for k in range(call.n_carry) if k not in summed]
        else:
            self.kept = list(range(call.n_carry))
        self.n_ys = n_ys
        # scan_loop's stacked outputs: a carry's shifted pair in one array of length + 1
        # rows (its initial carry in the extra row), the others each an array of its own.
        stacked = inner.output_avals()[inner.n_carry :]
        self.pairs: list[tuple[int, int, int, Aval]] = []  # (carry, before, after, rows)
        derived = set()
        for k, before, after in shifted_outputs(inner):
            if before in private:
                aval = stacked[after]
                rows = Aval((inner.length + 1, *aval.shape[1:]), aval.dtype)
                self.pairs.append((k, before, after, rows))
                derived.add(before)
                derived.add(after)
        self.alone = [(j, a) for j, a in enumerate(stacked) if j not in derived]
        self.stored = [j for j in range(len(stacked)) if j not in {p[1] for p in self.pairs}]
        self.reverse = inner.reverse
        self.n_stacked = len(stacked)
        self.n_inner_carry = inner.n_carry

    def __call__(self, arrays: Sequence[Any]) -> list[Any] | None:
        """The scan's outputs (final carries, then stacked outputs), or None: the caller
        runs the general path."""
        if not loop_table.ENABLED:
            return None
        for x, dtype in zip(arrays, self.dtypes, strict=True):
            if type(x) is not np.ndarray or x.dtype != dtype:
                return None  # scan_loop converts it
        nc, ncar, hoisted = self.nc, self.ncar, self.hoisted
        consts, xs = arrays[:nc], arrays[nc + ncar :]
        if hoisted is None:
            carry = arrays[nc : nc + ncar]
            stacked = [np.ascontiguousarray(x) for x in xs]
        else:  # HoistedScan.run's inner scan
            consts = [
                *consts,
                *(
                    np.ascontiguousarray(consts[i].transpose(axes))
                    for i, axes in hoisted.transposed
                ),
            ]
            carry = [arrays[nc + k] for k in self.kept]
            stacked = [
                *(np.ascontiguousarray(xs[i]) for i in hoisted.xs_read),
                *(np.ascontiguousarray(p.stack(arrays[:nc], xs)) for p in hoisted.products),
            ]
        ys: list[Any] = [None] * self.n_stacked
        for k, before, after, rows in self.pairs:
            both = self.empty(-1 - after, rows)
            first, rest = (both[:-1], both[1:]) if self.reverse else (both[1:], both[:-1])
            ys[after], ys[before] = first, rest
            both[-1 if self.reverse else 0] = carry[k]
        for j, aval in self.alone:
            ys[j] = self.empty(j, aval)
        n = self.n_inner_carry
        stores = [(ys[j], n + j) for j in self.stored]
        program = self.looped.program
        final = None if program is None else program.run(consts, carry, stacked, stores)
        if final is None:
            return None
        if hoisted is None:
            return [*final, *ys]
        carries: list[Any] = [None] * ncar
        for k, c in zip(self.kept, final, strict=True):
            carries[k] = c
        added = ys[len(ys) - hoisted.n_added :]
        for s in hoisted.sums:
            carries[s.carry] = s.add_total(arrays[nc + s.carry], xs, added)
        return [*carries, *hoisted.relay(ys[: self.n_ys])]
