"""Every op and every fastgrad.numpy function at its awkward points, against an oracle.

Each primitive lists its `special_points` in its record (next to its `domain`): ties,
kinks, zeros, domain edges, huge, infinite and nan inputs, size-0 and size-1 axes. The
composites of fastgrad.numpy list theirs in COMPOSITES below. At every point, in float32
and float64:

- the value matches the oracle (tests/mpmath_oracle.py, mpmath: no code shared with fastgrad),
  and NumPy's inf/nan where it has no finite value;
- the derivatives of orders 1, 2 and 3, taken by every sequence of modes (rev, fwd,
  rev-over-fwd, fwd-over-rev, rev-over-rev, fwd-over-fwd and the eight of order 3), match
  what the oracle expects there (see oracle.expect): the derivative, a divergence (inf or
  nan), a limit at inf, or, at a kink, the row of docs/conventions.md the point names
  (tested in test_conventions.py);
- the fused kernels give what the reference interpreter gives.

A new op without special points, without an oracle, or with a kink no convention covers
fails here with a message saying what to add.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import mpmath
import numpy as np
import pytest
import scipy.special

import fastgrad as fg
import fastgrad.numpy as fnp
import fastgrad.scipy.special as fss
import mpmath_oracle as oracle
from fastgrad.core.primitive import REGISTRY, Point, at, points
from fastgrad.core.tracing import bind
from fastgrad.testing import directional_derivative
from numpy_values import VALUES, Values

inf, nan = math.inf, math.nan
DTYPES = [np.float32, np.float64]
ORDER = 3
MODES = {k: list(itertools.product(("rev", "fwd"), repeat=k)) for k in range(1, ORDER + 1)}
# Tolerance, relative to the derivative or (below 1 in magnitude) absolute: rules such as
# tanh' = 1 - tanh**2 lose what is below the rounding of 1 (tanh'(20) = 1.7e-17 is 0).
RTOL = {np.float32: 1e-4, np.float64: 1e-11}
EXEMPT = {
    "const": "a constant has no inputs",
    # Samplers take only an integer key: there is no input point to place and no
    # derivative; tests/test_random.py checks their bits and their statistics.
    "random_bits": "a sampler of a key",
    "random_exponential": "a sampler of a key",
    "random_normal": "a sampler of a key",
    "random_uniform": "a sampler of a key",
    # Gamma samples' gradient in a is implicit (the CDF's derivatives at the sample), not a
    # function with points to place; tests/test_random_samplers.py checks it with mpmath.
    "random_gamma": "a sampler of a key and its shape parameter",
    "random_gamma_grad": "the implicit derivative of a gamma sample",
    "random_gamma_grad2": "a second partial of the implicit derivative",
    # The samplers over a batch of keys (vmap); tests/test_vmap.py checks them against a
    # loop over the keys.
    "random_bits_keys": "a sampler of keys",
    "random_exponential_keys": "a sampler of keys",
    "random_normal_keys": "a sampler of keys",
    "random_uniform_keys": "a sampler of keys",
    "random_gamma_keys": "a sampler of keys and its shape parameter",
}
# Ops and functions admitted without special points and an oracle: none now. A name put
# here is a visible gap (any op not listed, and not in EXEMPT, fails the registry tests
# below); remove it when it gets its points.
PENDING: set[str] = set()
DIRECTIONS = (1.0, -0.5, 0.75, -1.25, 0.5, 1.5, -0.75, 1.25)  # exact in float32


# ---------------------------------------------------------------- the composites


def _mp_softmax(x: Any, axis: int = -1) -> Any:
    e = np.vectorize(mpmath.exp, otypes=[object])(x)
    total = np.broadcast_to(np.sum(e, axis=axis, keepdims=True), e.shape)
    return np.vectorize(oracle.guard(oracle._div), otypes=[object])(e, total)


def _mp_logsumexp(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    total = np.sum(np.vectorize(mpmath.exp, otypes=[object])(x), axis=axis, keepdims=keepdims)
    return np.vectorize(mpmath.log, otypes=[object])(total)


def _mp_mean(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    x = np.asarray(x, dtype=object)
    count = math.prod(np.shape(x)[a] for a in _axes(axis, x.ndim))
    total = np.sum(x, axis=axis, keepdims=keepdims)
    return oracle._mp_array(total) / count if count else total * mpmath.nan


def _mp_var(x: Any, axis: Any = None, keepdims: bool = False, ddof: int = 0) -> Any:
    x = np.asarray(x, dtype=object)
    count = math.prod(np.shape(x)[a] for a in _axes(axis, x.ndim))
    centered = x - _mp_mean(x, axis, keepdims=True)
    return oracle._mp_array(np.sum(centered * centered, axis=axis, keepdims=keepdims)) / (
        count - ddof
    )


def _mp_std(*args: Any, **kw: Any) -> Any:
    return np.vectorize(mpmath.sqrt, otypes=[object])(_mp_var(*args, **kw))


def _axes(axis: Any, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    return tuple(a % ndim for a in (axis if isinstance(axis, tuple) else (axis,)))


def _scalar(f: Any) -> Any:
    return oracle.guard(f)


def _clip(x: Any, lo: Any, hi: Any) -> Any:
    return oracle._minimum(oracle._maximum(x, lo), hi)


def _relu(x: Any) -> Any:
    return oracle._maximum(x, mpmath.mpf(0))


@dataclass
class Composite:
    """A fastgrad.numpy function with no record of its own: its oracle and its points
    (`at(*args, **kwargs)`; float args are differentiated). `fg` calls the function when
    its signature is not (*args, **kwargs)."""

    mp: Any
    points: tuple[Point, ...]
    elementwise: bool = False
    fg: Any = None


_V = np.array([[1.5, -2.0, 0.5], [3.0, 0.25, -1.0]])
_COL = np.array([[0.5], [-1.5]])
_BIG = np.array([[1000.0, 1000.0, 999.0], [-1000.0, 0.0, 0.5]])
_HUGE = np.array([1e300, 1e300, -1e300])
_NONFIN = np.array([[inf, 1.0], [-inf, 2.0], [-inf, -inf]])

COMPOSITES: dict[str, Composite] = {
    "relu": Composite(
        _scalar(_relu),
        (
            at(0.0, convention="relu-at-zero"),
            at(-0.0, convention="relu-at-zero"),
            at(1.5),
            at(-1.5),
            at(inf),
            at(-inf),
            at(nan),
        ),
        elementwise=True,
    ),  # fmt: skip
    "softplus": Composite(
        _scalar(lambda x: mpmath.log1p(mpmath.exp(x))),
        tuple(at(x) for x in (0.0, 2.0, 40.0, -40.0, 1000.0, -1000.0, 100.0, inf, -inf, nan)),
        elementwise=True,
    ),
    "log_sigmoid": Composite(
        _scalar(lambda x: -mpmath.log1p(mpmath.exp(-x))),
        tuple(at(x) for x in (0.0, 2.0, 40.0, -40.0, 1000.0, -1000.0, 100.0, inf, -inf, nan)),
        elementwise=True,
    ),
    "clip": Composite(
        _scalar(_clip),
        (
            at(0.5, 0.0, 1.0),
            at(-2.0, 0.0, 1.0),
            at(3.0, 0.0, 1.0),
            at(2.0, 1.0, 0.0),
            at(0.0, 0.0, 1.0, convention="clip-at-bounds"),
            at(1.0, 0.0, 1.0, convention="clip-at-bounds"),
            at(inf, 0.0, 1.0),
            at(-inf, 0.0, 1.0),
            at(nan, 0.0, 1.0),
        ),
        elementwise=True,
    ),  # fmt: skip
    "mean": Composite(
        _mp_mean,
        (
            at(_V, axis=0),
            at(_V, axis=None, keepdims=True),
            at(np.array(2.5)),
            at(_COL, axis=1),
            at(np.zeros((0, 3)), axis=0),
            at(_NONFIN, axis=1),
        ),
    ),  # fmt: skip
    "var": Composite(
        _mp_var,
        (
            at(_V, axis=1),
            at(_V, axis=None),
            at(_V, axis=1, ddof=1),
            at(np.array(2.5)),
            at(_COL, axis=1),
            at(_COL.T, axis=0),
            at(_BIG[1:], axis=1),
            at(np.array([[0.5, 0.5, 0.5]]), axis=1),
            at(_NONFIN, axis=1),
        ),
    ),  # fmt: skip
    "std": Composite(
        _mp_std,
        (
            at(_V, axis=1),
            at(_V, axis=1, ddof=1),
            at(_V, axis=None, keepdims=True),
            at(np.array(2.5)),
            at(_COL, axis=1),
            at(_COL.T, axis=0),
            at(_BIG[1:], axis=1),
            at(np.array([[0.5, 0.5, 0.5]]), axis=1, convention="std-of-equal-values"),
            at(np.array([inf])),
            at(_NONFIN, axis=1),
        ),
    ),  # fmt: skip
    "logsumexp": Composite(
        _mp_logsumexp,
        (
            at(_V, axis=1),
            at(_V, axis=None),
            at(_BIG, axis=1),
            at(_HUGE),
            at(np.array(2.5)),
            at(_COL, axis=1),
            at(np.array([[0.5, 0.5, 0.5]]), axis=1, keepdims=True),
            at(_NONFIN, axis=1),
        ),
    ),  # fmt: skip
    "softmax": Composite(
        _mp_softmax,
        (
            at(_V),
            at(_V, axis=0),
            at(_BIG),
            at(_HUGE),
            at(_COL),
            at(np.array([0.5, 0.5, 0.5])),
            at(_NONFIN),
        ),
    ),  # fmt: skip
    "log_softmax": Composite(
        lambda x, axis=-1: np.asarray(x, dtype=object) - _mp_logsumexp(x, axis, True),
        (at(_V), at(_V, axis=0), at(_BIG), at(_COL), at(_NONFIN)),
    ),
    "vdot": Composite(
        lambda a, b: np.sum(np.asarray(a, dtype=object) * b), (at(_V, _V * 2), at(_V, _V))
    ),
    "outer": Composite(
        lambda a, b: np.multiply.outer(np.asarray(a, dtype=object).reshape(-1), b.reshape(-1)),
        (at(_V[0], _V[1]), at(np.zeros(0), _V[0])),
    ),
    "dot": Composite(
        lambda a, b: oracle._mp_array(np.dot(np.asarray(a, dtype=object), b)),
        (at(_V, _V[0]), at(_V[0], _V[1]), at(_V, _V.T), at(np.float64(2.0), _V)),
    ),
    "tensordot": Composite(
        lambda a, b, axes: oracle._mp_array(np.tensordot(np.asarray(a, dtype=object), b, axes)),
        (at(_V, _V, axes=((0, 1), (0, 1))), at(_V, _V.T, axes=1)),
    ),
    "expand_dims": Composite(
        lambda x, axis: np.expand_dims(np.asarray(x, dtype=object), axis), (at(_V, axis=1),)
    ),
    "squeeze": Composite(
        lambda x, axis=None: np.squeeze(np.asarray(x, dtype=object), axis), (at(_COL),)
    ),
    "ravel": Composite(lambda x: np.ravel(np.asarray(x, dtype=object)), (at(_V),)),
    "stack": Composite(
        lambda a, b, axis=0: np.stack([np.asarray(a, dtype=object), b], axis=axis),
        (at(_V, _V * 2, axis=1),),
        fg=lambda a, b, axis=0: fnp.stack([a, b], axis=axis),
    ),
    "swapaxes": Composite(
        lambda x, axis1, axis2: np.swapaxes(np.asarray(x, dtype=object), axis1, axis2),
        (at(_V, axis1=0, axis2=1),),
    ),
    "full_like": Composite(
        lambda x, fill_value: oracle._mp_array(
            np.full(np.shape(x), mpmath.mpf(fill_value), dtype=object)
        ),
        (at(_V, fill_value=2.5),),
    ),
    "zeros_like": Composite(
        lambda x: oracle._mp_array(np.zeros(np.shape(x), dtype=object)), (at(_V),)
    ),
    "ones_like": Composite(
        lambda x: oracle._mp_array(np.ones(np.shape(x), dtype=object)), (at(_V),)
    ),
    "asarray": Composite(lambda x: x, (at(_V), at(np.array(nan)))),
    # Complex-number functions, on real numbers (the oracle has no -0.0: angle(-0.0) is pi).
    **{
        name: Composite(
            _scalar(f),
            tuple(at(x) for x in (0.0, -0.0, 1.5, -2.0, inf, -inf, nan)),
            elementwise=True,
        )
        for name, f in (
            ("real", lambda x: x),
            ("conj", lambda x: x),
            ("conjugate", lambda x: x),
            ("imag", lambda x: mpmath.mpf(0)),
        )
    },
    "angle": Composite(
        _scalar(lambda x: x if mpmath.isnan(x) else mpmath.pi if x < 0 else mpmath.mpf(0)),
        (at(0.0, convention="piecewise-constant"), at(1.5), at(-2.0), at(inf), at(-inf), at(nan)),
        elementwise=True,
    ),
    "array": Composite(lambda x: x, (at(_V),)),
}


def _on_objects(fn: Any) -> Any:
    """NumPy's own function on object arrays of mpf: the oracle of a function that only
    moves, selects, adds and multiplies entries."""
    return lambda *a, **kw: oracle._mp_array(np.asarray(fn(*a, **kw), dtype=object))


_SQUARE = np.array([[1.5, -2.0, 0.5], [3.0, 0.25, -1.0], [0.0, 2.0, -0.5]])
_ROW = np.array([1.5, -2.0, 0.5, 0.0])
# Functions that move, select, add and multiply entries (their derivatives are constant
# or polynomial: no kinks), at a general point, at zeros and at size-0 and size-1 axes.
_STRUCTURAL: dict[str, tuple[Point, ...]] = {
    "flip": (at(_V, axis=1), at(_V), at(np.zeros((0, 2)), axis=0)),
    "fliplr": (at(_V),),
    "flipud": (at(_V),),
    "roll": (at(_V, 2, axis=1), at(_V, -1), at(_COL, 1, axis=1)),
    "rot90": (at(_V), at(_V, 3)),
    "tril": (at(_SQUARE), at(_V, -1)),
    "triu": (at(_SQUARE), at(_V, 1)),
    "diagonal": (at(_SQUARE), at(_V, 1)),
    "trace": (at(_SQUARE), at(_V, -1)),
    "diag": (at(_SQUARE), at(_ROW), at(_ROW, 1)),
    "diagflat": (at(_V),),
    "moveaxis": (at(_V[None], 0, 2),),
    "rollaxis": (at(_V[None], 2),),
    "permute_dims": (at(_V[None], (2, 0, 1)),),
    "matrix_transpose": (at(_V),),
    "tile": (at(_V, 2), at(_ROW, (2, 1))),
    "repeat": (at(_V, 2, axis=1), at(_ROW, 3)),
    "atleast_1d": (at(np.array(2.5)),),
    "atleast_2d": (at(_ROW),),
    "atleast_3d": (at(_V),),
    "copy": (at(_V), at(np.array(nan))),
    "positive": (at(_V), at(np.array([inf, -inf, nan]))),
    "append": (at(_V, _V[:1], axis=0), at(_ROW, _ROW)),
    "delete": (at(_V, 1, axis=1), at(_ROW, [0, 2])),
    "take": (at(_ROW, np.array([3, 0, 0])), at(_V, np.array([2, 2]), axis=1)),
    "take_along_axis": (at(_V, np.array([[2, 0, 0], [1, 1, 2]]), axis=1),),
    "diff": (at(_V, axis=1), at(_ROW, 2), at(_V[:, :1], axis=1)),
    "ediff1d": (at(_V),),
    "cumulative_sum": (at(_V, axis=1), at(_ROW, include_initial=True)),
    "kron": (at(_V, _COL),),
    "inner": (at(_V, _V), at(_ROW, _ROW)),
    "cross": (at(_V, _V[::-1]), at(_V[:1], _V[1:])),
    "trapezoid": (at(_V, axis=1), at(_ROW, dx=0.5), at(_ROW, _ROW * 2)),
    "polyval": (at(_ROW, _V), at(_ROW, 0.0)),
    "polyadd": (at(_ROW, _V[0]),),
    "polysub": (at(_ROW, _V[0]),),
    "polymul": (at(_ROW, _V[0]),),
    "polyder": (at(_ROW), at(_ROW, 2)),
    "polyint": (at(_ROW), at(_ROW, 2)),
    "vander": (at(_ROW), at(_ROW, 2, increasing=True)),
    "convolve": (at(_ROW, _V[0]), at(_ROW, _V[0], "same")),
    "correlate": (at(_ROW, _V[0]), at(_ROW, _V[0], "full")),
    "average": (at(_V, axis=1), at(_V, axis=0, weights=np.array([0.25, 0.75]))),
}
for _name, _points in _STRUCTURAL.items():
    COMPOSITES[_name] = Composite(_on_objects(getattr(np, _name)), _points)
# Functions of a list of arrays (called here on two) or of several arrays at once.
for _name, _points in (
    ("hstack", (at(_V, _COL),)),
    ("vstack", (at(_V, _V[:1]),)),
    ("dstack", (at(_V, _V),)),
    ("row_stack", (at(_V, _V[:1]),)),
    ("column_stack", (at(_ROW, _ROW * 2),)),
    ("concat", (at(_V, _V[:1]), at(_V, np.zeros((0, 3))))),
):
    COMPOSITES[_name] = Composite(
        _on_objects(lambda a, b, _n=_name: getattr(np, _n.replace("row_", "v"))([a, b])),
        _points,
        fg=lambda a, b, _n=_name: getattr(fnp, _n)([a, b]),
    )
# Splits, whose parts are concatenated again (as a gradient would gather them).
for _name, _points in (
    ("split", (at(_V, 3, axis=1),)),
    ("array_split", (at(_ROW, 3),)),
    ("hsplit", (at(_V, 3),)),
    ("vsplit", (at(_V, 2),)),
    ("dsplit", (at(_V[None], 3),)),
    ("unstack", (at(_V),)),
):
    COMPOSITES[_name] = Composite(
        _on_objects(lambda *a, _n=_name, **kw: np.concatenate(
            [np.ravel(p) for p in getattr(np, _n)(*a, **kw)])),
        _points,
        fg=lambda *a, _n=_name, **kw: fnp.concatenate(
            [fnp.ravel(p) for p in getattr(fnp, _n)(*a, **kw)]),
    )  # fmt: skip
COMPOSITES["matvec"] = Composite(_on_objects(lambda a, v: a @ v), (at(_SQUARE, _V[0]),))
COMPOSITES["vecmat"] = Composite(_on_objects(lambda v, a: v @ a), (at(_V[0], _SQUARE),))
COMPOSITES["vecdot"] = Composite(
    _on_objects(lambda a, b: np.sum(a * b, axis=-1)), (at(_V, _V[::-1]),)
)
for _name, _factor in (("deg2rad", 1), ("radians", 1), ("rad2deg", -1), ("degrees", -1)):
    COMPOSITES[_name] = Composite(
        _scalar(lambda x, _k=_factor: x * (mpmath.pi / 180) ** _k),
        # (Finite points only: x * pi / 180 rounds at every precision, and at the stand-ins
        # for inf and nan the oracle's second differences would amplify that rounding.)
        tuple(at(x) for x in (0.0, 90.0, -1e30, 1e-30)),
        elementwise=True,
    )


def _filled(x: Any, fill: Any) -> Any:
    """x with its nan entries replaced by `fill` (how the nan-ignoring functions see it)."""
    return np.vectorize(lambda v: fill if oracle.is_nan(v) else v, otypes=[object])(x)


def _mp_nanmean(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    x = np.asarray(x, dtype=object)
    count = np.sum(np.vectorize(lambda v: 0 if oracle.is_nan(v) else 1)(x), axis, keepdims=keepdims)
    return oracle._mp_array(np.sum(_filled(x, 0), axis, keepdims=keepdims) / count)


def _nan_reduction(name: str, fill: Any) -> Any:
    reduce = oracle._reduce
    if name in ("max", "min"):
        op = oracle._maximum if name == "max" else oracle._minimum
        return lambda x, axis=None, keepdims=False: reduce(op)(
            _filled(x, fill), _axes(axis, np.ndim(x)), keepdims
        )
    fn = {"sum": np.sum, "prod": np.prod, "cumsum": np.cumsum, "cumprod": np.cumprod}[name]
    return lambda x, **kw: oracle._mp_array(fn(_filled(x, fill), **kw))


_NANS = np.array([[1.5, nan, 0.5], [2.0, -1.0, nan]])
_WITH_ZEROS = np.array([[1.5, 0.0, 0.5, 2.0], [0.0, -1.0, 0.0, 3.0]])
_TIED = np.array([[1.0, 1.0, 0.5], [2.0, -1.0, 2.0]])
_nan_entries = {"convention": "nan-inputs"}
for _name, _fill in (("sum", 0), ("prod", 1), ("cumsum", 0), ("cumprod", 1)):
    COMPOSITES["nan" + _name] = Composite(
        _nan_reduction(_name, mpmath.mpf(_fill)),
        (at(_V, axis=1), at(_V), at(_WITH_ZEROS, axis=1), at(_NANS, axis=1, **_nan_entries)),
    )
for _name, _fill in (("max", -inf), ("min", inf)):
    COMPOSITES["nan" + _name] = Composite(
        _nan_reduction(_name, mpmath.mpf(_fill)),
        (at(_V, axis=1), at(_V[:, :1], axis=1), at(_NANS, axis=1, **_nan_entries),
         at(_TIED, axis=1, convention="max-min-reduction-ties")),
    )  # fmt: skip
COMPOSITES["nanmean"] = Composite(
    _mp_nanmean, (at(_V, axis=1), at(_V), at(_NANS, axis=1, **_nan_entries))
)
COMPOSITES["cumprod"] = Composite(
    _on_objects(np.cumprod),
    (at(_V, axis=1), at(_WITH_ZEROS, axis=1), at(_WITH_ZEROS), at(np.zeros((2, 0)), axis=1)),
)
COMPOSITES["ptp"] = Composite(
    _on_objects(lambda x, **kw: np.max(x, **kw) - np.min(x, **kw)),
    (at(_V, axis=1), at(_V), at(_TIED, axis=1, convention="max-min-reduction-ties")),
)
COMPOSITES["fabs"] = Composite(
    _scalar(abs),
    (at(0.0, convention="abs-at-zero"), at(-0.0, convention="abs-at-zero"),
     *(at(x) for x in (1.5, -2.0, inf, -inf, nan))),
    elementwise=True,
)  # fmt: skip
COMPOSITES["fix"] = Composite(
    _scalar(oracle.SCALAR["trunc"]),
    (at(2.0, convention="piecewise-constant"), *(at(x) for x in (1.3, -1.3, 0.0, inf, nan))),
    elementwise=True,
)
COMPOSITES["sinc"] = Composite(
    _scalar(lambda x: mpmath.sincpi(x)),
    tuple(at(x) for x in (0.0, -0.0, 0.5, 1.0, -2.0, 1e-30, 1e-5, 0.0499, 1e10, 1e20)),
    elementwise=True,
)
COMPOSITES["float_power"] = Composite(
    _scalar(oracle._power),
    (*(at(x, y) for x, y in ((2.0, 3.0), (0.5, -1.5), (1.5, 0.5), (-2.0, 2.0), (0.0, 2.0))),
     at(0.0, 0.0, convention="power-at-zero-base")),
    elementwise=True,
)  # fmt: skip


# Order statistics: ties follow the stable sort (the sort-ties row); q and the entries are
# differentiated, q at a position between two values (at a value it is a kink in q).
def _mp_nan_order(fn: Any) -> Any:
    """fn (a quantile or a variance) of each slice along `axis` without its nans (nan for
    a slice of nans only), for 2-D x and an int axis."""

    def f(x: Any, *q: Any, axis: int, **kw: Any) -> Any:
        rows = np.moveaxis(np.asarray(x, dtype=object), axis, -1)
        out = []
        for row in rows:
            kept = np.array([v for v in row if not oracle.is_nan(v)], dtype=object)
            out.append(fn(kept, *q, **kw) if kept.size else mpmath.nan)
        return oracle._mp_array(np.array(out, dtype=object))

    return f


def _mp_slice_var(x: Any, ddof: int = 0) -> Any:
    return np.sum((x - np.mean(x)) ** 2) / (len(x) - ddof)


_TIES3 = np.array([[1.0, 2.0, 1.0], [-0.5, -0.5, -0.5]])
for _name, _q in (("median", ()), ("quantile", (0.3,)), ("percentile", (30.0,))):
    COMPOSITES[_name] = Composite(
        _on_objects(getattr(np, _name)),
        (at(_V, *_q, axis=1), at(_V, *_q), at(_TIES3, *_q, axis=1, convention="sort-ties")),
    )
    COMPOSITES["nan" + _name] = Composite(
        _mp_nan_order(getattr(np, _name)),
        (at(_V, *_q, axis=1), at(_NANS, *_q, axis=1, **_nan_entries),
         at(_TIES3, *_q, axis=1, convention="sort-ties")),
    )  # fmt: skip
for _name, _fn in (("nanvar", _mp_slice_var), ("nanstd", lambda x: mpmath.sqrt(_mp_slice_var(x)))):
    COMPOSITES[_name] = Composite(
        _mp_nan_order(_fn), (at(_V, axis=1), at(_NANS, axis=1, **_nan_entries))
    )
COMPOSITES["cumulative_prod"] = Composite(
    _on_objects(np.cumulative_prod), (at(_V, axis=1), at(_WITH_ZEROS, axis=1))
)
COMPOSITES["einsum"] = Composite(
    _on_objects(np.einsum), (at("ij,kj->ik", _V, _V), at("ii", _SQUARE), at("i,i", _ROW, _ROW))
)
COMPOSITES["pad"] = Composite(
    _on_objects(np.pad),
    (at(_V, 1), at(_V, ((0, 1), (2, 1)), mode="reflect"), at(_V, (1, 2), mode="edge"),
     at(_V, 2, mode="wrap"), at(_ROW, 3, mode="symmetric")),
)  # fmt: skip
COMPOSITES["i0"] = Composite(
    _scalar(lambda x: mpmath.besseli(0, x)),
    tuple(at(x) for x in (0.0, 1.5, -2.0, 30.0, nan)),
    elementwise=True,
)
# fastgrad.scipy.special.i1 (not a fastgrad.numpy name), exp(abs(x)) i1e(x) away from 0.
COMPOSITES["i1"] = Composite(
    _scalar(lambda x: mpmath.besseli(1, x)),
    tuple(at(x) for x in (0.0, 0.2, -1.5, 30.0, nan)),
    elementwise=True,
    fg=lambda x: fss.i1(x),
)
COMPOSITES["nan_to_num"] = Composite(
    # (Not at inf: what replaces it is the tested dtype's largest number.)
    _scalar(lambda x: mpmath.mpf(0) if oracle.is_nan(x) else x),
    (*(at(x) for x in (1.5, -0.0, -1e30)), at(nan, convention="nan-inputs")),
    elementwise=True,
)


def _mp_gradient(f: Any, axis: int = -1) -> Any:
    """Central differences inside, one-sided ones at the two ends (unit spacing)."""
    f = np.moveaxis(np.asarray(f, dtype=object), axis, -1)
    out = np.empty(f.shape, dtype=object)
    out[..., 1:-1] = (f[..., 2:] - f[..., :-2]) / 2
    out[..., 0], out[..., -1] = f[..., 1] - f[..., 0], f[..., -1] - f[..., -2]
    return oracle._mp_array(np.moveaxis(out, -1, axis))


def _mp_cov(m: Any) -> Any:
    c = np.asarray(m, dtype=object)
    c = c - np.sum(c, axis=1, keepdims=True) / c.shape[1]
    return oracle._mp_array((c @ c.T) / (c.shape[1] - 1))


def _mp_corrcoef(m: Any) -> Any:
    c = _mp_cov(m)
    scale = np.vectorize(mpmath.sqrt, otypes=[object])(np.diagonal(c).copy())
    return oracle._mp_array(c / np.outer(scale, scale))


def _mp_linspace(start: Any, stop: Any, num: int) -> Any:
    return oracle._mp_array(np.array([start + (stop - start) * i / (num - 1)
                                      for i in range(num)], dtype=object))  # fmt: skip


_STATS = np.array([[1.0, 2.0, 4.0, -0.5], [0.5, -1.0, 2.0, 1.5], [3.0, 0.25, -2.0, 1.0]])
COMPOSITES["gradient"] = Composite(_mp_gradient, (at(_V, axis=1), at(_ROW)))
COMPOSITES["cov"] = Composite(_mp_cov, (at(_STATS),))
COMPOSITES["corrcoef"] = Composite(_mp_corrcoef, (at(_STATS),))
COMPOSITES["linspace"] = Composite(_mp_linspace, (at(0.5, 2.0, 4), at(-1.0, 3.0, 2)))
COMPOSITES["geomspace"] = Composite(
    lambda a, b, num: oracle._mp_array(np.array(
        [a * (b / a) ** (mpmath.mpf(i) / (num - 1)) for i in range(num)], dtype=object)),
    (at(0.5, 2.0, 3), at(-1.0, -8.0, 4)),
)  # fmt: skip
COMPOSITES["logspace"] = Composite(
    lambda a, b, num: oracle._mp_array(np.array(
        [mpmath.power(10, x) for x in _mp_linspace(a, b, num)], dtype=object)),
    (at(0.5, 2.0, 3),),
)  # fmt: skip
# Piecewise linear: at a knot the slope is the right segment's (the interp-at-knots row).
_KNOTS, _HEIGHTS = np.array([0.0, 1.0, 3.0]), np.array([0.0, 2.0, 3.0])


def _mp_interp(x: Any, xp: Any, fp: Any) -> Any:
    """Linear between the knots around each x (the right segment at a knot), clamped."""

    def one(v: Any) -> Any:
        if v <= xp[0] or v >= xp[-1]:
            return fp[0] if v <= xp[0] else fp[-1]
        i = max(j for j in range(len(xp)) if xp[j] <= v)
        return fp[i] + (v - xp[i]) * (fp[i + 1] - fp[i]) / (xp[i + 1] - xp[i])

    return oracle._mp_array(np.array([one(v) for v in np.asarray(x, dtype=object)], dtype=object))


COMPOSITES["interp"] = Composite(
    _mp_interp,
    (at(np.array([0.5, 2.0]), _KNOTS, _HEIGHTS),
     at(np.array([1.0]), _KNOTS, _HEIGHTS, convention="interp-at-knots")),
)  # fmt: skip
COMPOSITES["ldexp"] = Composite(
    _scalar(lambda x, n: x * mpmath.mpf(2) ** int(n)),
    tuple(at(x, n) for x, n in ((1.5, 3), (-0.75, -2), (0.0, 5), (inf, 1), (nan, 2))),
    elementwise=True,
)
for _name in ("round", "around"):
    COMPOSITES[_name] = Composite(
        _scalar(lambda x: mpmath.nint(x) if mpmath.isfinite(x) else x),
        (*(at(x, convention="piecewise-constant") for x in (0.5, 1.5, -2.5)),
         *(at(x) for x in (1.3, -0.7, 0.0, 1e300, inf, nan))),
        elementwise=True,
    )  # fmt: skip


# ---------------------------------------------------------------- fastgrad.scipy.special
# Its functions composed of others (fastgrad.scipy.special's names are covered as
# fastgrad.numpy's are: test_every_public_function_is_covered).


def _mp_logit(p: Any) -> Any:
    if p < 0 or p > 1:
        return mpmath.nan
    return -mpmath.inf if p == 0 else mpmath.inf if p == 1 else mpmath.log(p / (1 - p))


def _mp_xlog(shift: int) -> Any:
    """xlogy (shift 0) and xlog1py (shift 1): x log(y + shift), 0 where x == 0 (unless y is
    nan)."""
    return lambda x, y: (
        mpmath.mpf(0) if x == 0 and not oracle.is_nan(y) else x * mpmath.log(y + shift)
    )


def _mp_relative_entropy(extra: Any) -> Any:
    """x log(x / y) + extra(x, y) for x, y > 0; extra(0, y) where x == 0 <= y; inf else."""

    def f(x: Any, y: Any) -> Any:
        if oracle.is_nan(x) or oracle.is_nan(y):
            return mpmath.nan
        if x > 0 and y > 0:
            return x * mpmath.log(x / y) + extra(x, y)
        return extra(x, y) if x == 0 and y >= 0 else mpmath.inf

    return f


_FSS_NONFINITE = (inf, -inf, nan)
_FSS: dict[str, tuple[Any, tuple[Point, ...]]] = {
    "expit": (oracle._sigmoid, (0.0, 2.0, -40.0, 40.0, 1000.0, -1000.0, *_FSS_NONFINITE)),
    "log_expit": (
        lambda x: -mpmath.log1p(mpmath.exp(-x)),
        (0.0, 2.0, 40.0, -40.0, 1000.0, -1000.0, *_FSS_NONFINITE),
    ),
    "logit": (_mp_logit, (0.5, 0.25, 1e-10, 0.0, 1.0, 1.5, -0.5, nan)),
    "ndtr": (mpmath.ncdf, (0.0, 2.0, -2.0, -40.0, 10.0, 40.0, *_FSS_NONFINITE)),
    "entr": (
        lambda x: -mpmath.inf if x < 0 else mpmath.mpf(0) if x == 0 else -x * mpmath.log(x),
        (0.5, 1.0, 2.0, 1e-10, 0.0, -0.0, -1.0, inf, -inf, nan),
    ),
    "xlogy": (
        _mp_xlog(0),
        ((1.5, 2.0), at(0.0, 0.0, convention="xlogy-at-zero"), (0.0, 1.0), (0.0, 2.5),
         at(0.0, -1.0, convention="xlogy-at-zero"), (2.0, 0.0), (-1.0, 0.5), (1.0, inf),
         (0.0, nan), (nan, 1.0)),
    ),
    "xlog1py": (
        _mp_xlog(1),
        ((1.5, 2.0), at(0.0, -1.0, convention="xlogy-at-zero"), (0.0, 0.0),
         at(0.0, -2.0, convention="xlogy-at-zero"), (2.0, -1.0), (0.5, -0.5), (1.0, inf),
         (0.0, nan)),
    ),
    "rel_entr": (
        _mp_relative_entropy(lambda x, y: mpmath.mpf(0)),
        ((2.0, 1.0), (1.0, 1.0), (0.5, 3.0), (0.0, 1.0), (1.0, 0.0), (-1.0, 1.0), (0.0, -1.0),
         (1.0, inf), (nan, 1.0), at(0.0, 0.0, convention="edges-of-the-domain")),
    ),
    "kl_div": (
        _mp_relative_entropy(lambda x, y: y - x),
        ((2.0, 1.0), (1.0, 1.0), (0.5, 3.0), (0.0, 1.0), (1.0, 0.0), (-1.0, 1.0), (0.0, -1.0),
         (1.0, inf), (nan, 1.0), at(0.0, 0.0, convention="edges-of-the-domain")),
    ),
    # The Bessel functions of order 0 and 1: jv, yv, kv, kve at a fixed order (tested at
    # more orders in their records).
    **{name: (lambda x, _f=f, _n=n: _f(_n, x), (0.0, 1.0, 2.5, 30.0, 1e3, inf, nan))
       for name, f, n in (("j0", mpmath.besselj, 0), ("j1", mpmath.besselj, 1),
                          ("y0", mpmath.bessely, 0), ("y1", mpmath.bessely, 1),
                          ("k0", mpmath.besselk, 0), ("k1", mpmath.besselk, 1))},
    "k0e": (lambda x: mpmath.exp(x) * mpmath.besselk(0, x), (0.0, 1.0, 2.5, 30.0, 1e3, nan)),
    "k1e": (lambda x: mpmath.exp(x) * mpmath.besselk(1, x), (0.0, 1.0, 2.5, 30.0, 1e3, nan)),
}  # fmt: skip
for _name, (_f, _pts) in _FSS.items():
    COMPOSITES[_name] = Composite(
        _scalar(_f), points(*_pts), elementwise=True, fg=getattr(fss, _name)
    )


# ---------------------------------------------------------------- selecting and assembling
# fastgrad.numpy functions with integer, boolean or shape parameters whose float results
# are differentiable: NumPy's own function on object arrays of mpf is the oracle (they
# move, select and add entries), at ties, edges, jumps (with their convention) and size-0
# and size-1 axes. The parts of functions with several results are concatenated.


def _joined(fn: Any) -> Any:
    """fn's results (a tuple or list of arrays) raveled and concatenated, in NumPy or fnp."""
    on_objects = fn.__module__.startswith("numpy")

    def joined(*a: Any, **kw: Any) -> Any:
        parts = fn(*a, **kw)
        if on_objects:
            return np.concatenate([np.ravel(np.asarray(p, dtype=object)) for p in parts])
        return fnp.concatenate([fnp.ravel(p) for p in parts])

    return joined


def _mp_modf(x: Any) -> Any:
    return np.array([[v - oracle._round_to_zero(v) for v in x],
                     [oracle._round_to_zero(v) for v in x]], dtype=object)  # fmt: skip


# On both edges, inside, and on an inner edge (the bin to its right, as NumPy).
_BINNED = np.array([0.0, 0.3, 1.0, 2.0, 1.6])


def _mp_histogram(weights: Any, bins: int = 4) -> Any:
    edges = np.linspace(_BINNED.min(), _BINNED.max(), bins + 1)
    which = np.minimum(np.searchsorted(edges, _BINNED, side="right") - 1, bins - 1)
    sums = [mpmath.mpf(0)] * bins
    for b, w in zip(which, weights, strict=True):
        sums[b] += w
    return oracle._mp_array(np.array(sums, dtype=object))


def _mp_polyfit(x: Any, y: Any, deg: int) -> Any:
    """The least-squares coefficients, highest power first: (V^T V)^-1 V^T y."""
    v = mpmath.matrix([[xi ** (deg - j) for j in range(deg + 1)] for xi in x])
    c = mpmath.lu_solve(v.T * v, v.T * mpmath.matrix(list(y)))
    return oracle._mp_array(np.array([c[j] for j in range(deg + 1)], dtype=object))


_SELECT_AT = (lambda a, b: [a > 0, a < -1], lambda a, b: [a, b * 2])
_ASSEMBLED: dict[str, Composite] = {
    "modf": Composite(
        lambda x: oracle._mp_array(_mp_modf(x)),
        (at(np.array([1.25, -2.75, 0.0, -0.0, 1000.5])),
         at(np.array([2.0, -3.0]), convention="piecewise-constant")),
        fg=lambda x: fnp.stack(fnp.modf(x)),
    ),
    "divmod": Composite(
        lambda x, y: oracle._mp_array(np.array(
            [[mpmath.floor(a / b), oracle.SCALAR["remainder"](a, b)]
             for a, b in zip(x, y, strict=True)],
            dtype=object).T),
        (at(np.array([2.5, -2.5, 7.0]), np.array([0.75, 0.75, -2.0])),
         at(np.array([1.5, -3.0]), np.array([0.75, 1.5]), convention="remainder-at-jumps")),
        fg=lambda x, y: fnp.stack(fnp.divmod(x, y)),
    ),
    "select": Composite(
        lambda a, b: oracle._mp_array(np.select(
            [np.array([v > 0 for v in a]), np.array([v < -1 for v in a])],
            [np.asarray(a, dtype=object), np.asarray(b, dtype=object) * 2], mpmath.mpf(0.5))),
        (at(np.array([1.5, -2.0, 0.5, -0.5]), np.array([0.25, 3.0, -1.0, 2.0])),
         at(np.array([0.0, -1.0]), np.array([1.0, 2.0]), convention="where")),
        fg=lambda a, b: fnp.select(_SELECT_AT[0](a, b), _SELECT_AT[1](a, b), 0.5),
    ),
    "partition": Composite(
        # The kth entries (the others' order is unspecified): sorted's.
        lambda x, kth, axis: np.take(oracle._sort(x, axis), kth, axis=axis),
        (at(_V, 1, axis=1), at(_V, 0, axis=0), at(_TIES3, 1, axis=1, convention="sort-ties")),
        fg=lambda x, kth, axis: fnp.take(fnp.partition(x, kth, axis), kth, axis=axis),
    ),
    "put_along_axis": Composite(
        _on_objects(lambda a, i, v, axis: _put(a, i, v, axis)),
        (at(_V, np.array([[2], [0]]), _COL, axis=1), at(_V, np.array([[0, 1, 1]]), _V[:1], axis=0)),
        fg=lambda a, i, v, axis: fnp.put_along_axis(a, i, v, axis, inplace=False),
    ),
    "insert": Composite(
        _on_objects(np.insert),
        (at(_V, 1, 9.0, axis=1), at(_ROW, [0, 4], _ROW[:2]), at(_V, 2, _V[0], axis=0)),
    ),
    "block": Composite(
        _on_objects(lambda a, b, c: np.block([[a, b], [c, c]])),
        (at(_V, _COL, np.ones((2, 2))),),
        fg=lambda a, b, c: fnp.block([[a, b], [c, c]]),
    ),
    "broadcast_arrays": Composite(
        _on_objects(_joined(np.broadcast_arrays)), (at(_V, _COL), at(_ROW, np.array(2.5))),
        fg=_joined(fnp.broadcast_arrays),
    ),
    "meshgrid": Composite(
        _on_objects(_joined(np.meshgrid)),
        (at(_ROW, _V[0]), at(_ROW, _V[0], indexing="ij"), at(_ROW, np.zeros(0))),
        fg=_joined(fnp.meshgrid),
    ),
    "full": Composite(
        lambda shape, fill_value: oracle._mp_array(np.full(shape, fill_value, dtype=object)),
        (at((2, 3), 1.5), at((0,), 2.0), at((), nan)),
    ),
    "histogram": Composite(
        # The weights' sums per bin (the values binned decide the shape: they are static).
        _mp_histogram,
        (at(_ROW[[0, 1, 2, 3, 0]]), at(np.array([inf, 1.0, nan, 0.5, -1.0]))),
        fg=lambda w: fnp.histogram(_BINNED, 4, weights=w)[0],
    ),
    "polyfit": Composite(_mp_polyfit, (at(_ROW, _ROW[::-1] * 2, 1), at(_ROW[:3], _V[0], 2))),
    "apply_along_axis": Composite(
        _on_objects(lambda a: np.apply_along_axis(lambda r: r * r[::-1], 1, a)),
        (at(_V),),
        fg=lambda a: fnp.apply_along_axis(lambda r: r * r[::-1], 1, a),
    ),
    "apply_over_axes": Composite(
        _on_objects(lambda a: np.apply_over_axes(np.sum, a, [0, 1])),
        (at(_V),),
        fg=lambda a: fnp.apply_over_axes(fnp.sum, a, [0, 1]),
    ),
}  # fmt: skip


def _put(a: Any, indices: Any, values: Any, axis: int) -> Any:
    out = np.array(a, dtype=object)
    np.put_along_axis(out, indices, values, axis)
    return out


COMPOSITES.update(_ASSEMBLED)


# ---------------------------------------------------------------- x.at[...] and debug prints
# fnp.at(x)[index].<method>(v), JAX's functional index updates, against a Python loop over
# the updates in turn (duplicates: set's last one wins, add/multiply/min/max combine in
# order). `index` is a static index, or "positive": the traced mask x > 0.


def _at_index(x: Any, index: Any) -> Any:
    return x > 0 if isinstance(index, str) else index


def _fg_at(x: Any, v: Any = None, *, method: str, index: Any) -> Any:
    target = fnp.at(x)[_at_index(x, index)]
    return target.get() if method == "get" else getattr(target, method)(v)


_AT_COMBINE = {
    "set": lambda old, new: new,
    "add": lambda old, new: old + new,
    "multiply": lambda old, new: old * new,
    "min": oracle._minimum,
    "max": oracle._maximum,
}


def _mp_at(x: Any, v: Any = None, *, method: str, index: Any) -> Any:
    out = np.array(x, dtype=object)
    if isinstance(index, str):
        index = np.vectorize(lambda a: bool(a > 0), otypes=[bool])(out)
    if method == "get":
        return oracle._mp_array(np.array(out[index], dtype=object))
    targets = np.arange(out.size).reshape(out.shape)[index]
    values = np.broadcast_to(np.asarray(v, dtype=object), targets.shape)
    flat = out.reshape(-1)
    for t, value in zip(targets.reshape(-1), values.reshape(-1), strict=True):
        flat[t] = _AT_COMBINE[method](flat[t], value)
    return oracle._mp_array(flat.reshape(out.shape))


_DUP = (np.array([0, 1, 0]), np.array([1, 2, 1]))  # (0, 1) twice
_UPD = np.array([2.5, -0.5, 4.0])
_ties = {"convention": "max-min-reduction-ties"}
COMPOSITES["at"] = Composite(
    _mp_at,
    (
        *(at(_V, _UPD, method=m, index=_DUP) for m in ("set", "add", "multiply", "min", "max")),
        at(_V, np.array([0.5, 2.0]), method="set", index=(slice(None), 1)),
        at(_V, np.float64(7.0), method="set", index=(np.array([1, 1, 0]),)),
        at(_V, np.array([[0.5, -1.5, 2.0]]), method="add", index=(np.array([-1]), slice(None))),
        at(_V, np.array([0.0, 2.0, 0.0, 1.5]), method="multiply",
           index=(np.array([0, 1, 0, 0]), np.array([1, 1, 1, 1]))),
        at(_NONFIN, np.array([5.0, -inf, nan]), method="add",
           index=(np.array([0, 1, 2]), np.array([0, 0, 1]))),
        at(_NONFIN, np.array([0.0, 2.0]), method="multiply",
           index=(np.array([0, 2]), np.array([0, 1]))),
        at(_V, np.zeros((0, 3)), method="add", index=(np.zeros(0, int),)),
        at(_V, np.array([1.0, 2.0]), method="set", index=_V < 0),
        at(_V, method="get", index=_DUP),
        at(_V, method="get", index=(slice(None, None, -1), np.array([2, 2, 0]))),
        *(at(_V, np.float64(0.75), method=m, index="positive")
          for m in ("set", "add", "multiply", "min", "max")),
        # Ties: an update equal to the element (and two equal updates to one element).
        at(_V, np.array([-2.0, 1.0, 1.0]), method="max",
           index=(np.array([0, 1, 1]), np.array([1, 0, 0])), **_ties),
        at(_V, np.array([0.5, 3.0, 0.25]), method="min",
           index=(np.array([0, 1, 1]), np.array([2, 0, 1])), **_ties),
        at(_V, np.float64(0.5), method="max", index="positive", **_ties),
    ),
    fg=_fg_at,
)  # fmt: skip


def _debug_printed(x: Any) -> Any:
    """The identity, printing x as it goes (tests/test_debug_print.py reads the prints)."""
    fg.debug.print("{}", x)
    return x


# debug_print, the effect behind fg.debug.print: it changes no value and no derivative.
COMPOSITES["debug_print"] = Composite(
    _on_objects(lambda x: x),
    (at(_V), at(np.array([inf, -inf, nan, -0.0])), at(np.zeros((0, 2))), at(np.array(2.5))),
    fg=_debug_printed,
)


# fastgrad.numpy names that are NumPy's own (constants, array creation).
NUMPY_NAMES = {name for name in fnp.__all__ if getattr(np, name, None) is getattr(fnp, name)}


def test_every_op_has_special_points():
    missing = sorted(
        n
        for n, p in REGISTRY.items()
        if n not in EXEMPT.keys() | PENDING | COMPOSITES.keys() and not p.special_points
    )
    assert not missing, (
        f"primitives without special points: {missing}. Add `special_points=` to each "
        "record, next to its `domain` (see fastgrad.core.primitive.Point and `at`): the "
        "ties, kinks, zeros, domain edges, huge, infinite and nan inputs, and size-0 and "
        "size-1 axes where the op is awkward. Registry: " + ", ".join(sorted(REGISTRY))
    )


def test_pending_lists_only_uncovered_names():
    covered = {n for n, p in REGISTRY.items() if p.special_points} | set(COMPOSITES) | set(VALUES)
    unknown = PENDING - set(REGISTRY) - set(fnp.__all__)
    assert not (PENDING & covered) and not unknown, (
        f"remove from PENDING: {sorted(PENDING & covered)} (covered), {sorted(unknown)} "
        "(no such op or function)"
    )


def test_every_differentiable_op_has_an_oracle():
    missing = sorted(
        n
        for n, p in REGISTRY.items()
        if n not in EXEMPT.keys() | PENDING and p.vjp is not None and oracle.mp_function(n) is None
    )
    assert not missing, (
        f"primitives without an oracle: {missing}. Write each again with mpmath in "
        "tests/mpmath_oracle.py (SCALAR for elementwise ops, ARRAY for the others)."
    )


@pytest.mark.parametrize("namespace", [fnp, fss], ids=lambda m: m.__name__)
def test_every_public_function_is_covered(namespace):
    uncovered = []
    for name in namespace.__all__:
        fn = getattr(namespace, name)
        if name in NUMPY_NAMES | PENDING | VALUES.keys() or name in REGISTRY | COMPOSITES:
            continue
        if any(fn is getattr(namespace, other) for other in list(REGISTRY) + list(COMPOSITES)
               if hasattr(namespace, other)):  # fmt: skip
            continue  # an alias (absolute, amax, true_divide, psi...)
        uncovered.append(name)
    assert not uncovered, (
        f"{namespace.__name__} functions without special points: {uncovered}. A function "
        "that applies a primitive of the same name is covered by the primitive's record; "
        "for one composed of several, add an entry to COMPOSITES in "
        "tests/test_special_points.py (its mpmath version and its points)."
    )


# ---------------------------------------------------------------- evaluating a point


@dataclass
class Case:
    """One point of one function: how fastgrad computes it and how the oracle does."""

    name: str
    seed: int
    point: Point
    op: Any  # the fastgrad function: op(*args, **params)
    mp_op: Any  # the oracle's version
    floats: list[np.ndarray]  # the float args, in the dtype under test
    where: list[int]  # their positions among the args
    elementwise: bool  # scalar args: batched into arrays, derivatives per element
    fixed: dict[int, np.ndarray]  # float args held fixed (the op's held_fixed), in the dtype

    @property
    def label(self) -> str:
        return f"{self.name} {self.point!r}"

    def args(self, floats: Any, others: Any = None) -> list[Any]:
        args = list(self.point.args if others is None else others)
        if others is None:
            args = [self.fixed.get(i, a) for i, a in enumerate(args)]
        for i, x in zip(self.where, floats, strict=True):
            args[i] = x
        return [np.asarray(a) if isinstance(a, bool) else a for a in args]

    def fg_fun(self, *floats: Any) -> Any:
        return self.op(*self.args(floats), **self.point.params)

    def mp_fun(self, *floats: Any) -> Any:
        args = self.args(floats)
        for i in self.fixed:  # the point's own (exact) number
            args[i] = oracle.to_mp(np.float64(self.point.args[i]))
        return self.mp_op(*args, **self.point.params)


def _is_float(a: Any) -> bool:
    return isinstance(a, float) or (
        isinstance(a, np.ndarray | np.generic) and np.asarray(a).dtype.kind == "f"
    )


def cases(name: str, dtype: Any) -> list[Case]:
    if name in COMPOSITES:
        comp = COMPOSITES[name]
        op, mp_op, pts = comp.fg or getattr(fnp, name), comp.mp, comp.points
        scalar = [comp.elementwise] * len(pts)
    else:
        prim = REGISTRY[name]
        op = lambda *a, _p=prim, **kw: bind(_p, *a, **kw)  # noqa: E731
        mp_op, pts = oracle.mp_function(name), prim.special_points
        if mp_op is None and prim.vjp is not None:
            pytest.fail(
                f"{name} has no oracle: write it again with mpmath in tests/mpmath_oracle.py"
            )
        scalar = [all(isinstance(a, float | bool | int) for a in pt.args) for pt in pts]
    held = REGISTRY[name].held_fixed if name in REGISTRY else ()
    out = []
    for seed, (pt, elementwise) in enumerate(zip(pts, scalar, strict=True)):
        where = [i for i, a in enumerate(pt.args) if _is_float(a) and i not in held]
        with np.errstate(over="ignore"):  # beyond float32's range: inf
            floats = [np.asarray(pt.args[i], dtype=dtype) for i in where]
            fixed = {i: np.asarray(pt.args[i], dtype=dtype) for i in held}
        out.append(Case(name, seed, pt, op, mp_op, floats, where, elementwise, fixed))
    return out


def directions(case: Case) -> list[list[np.ndarray]]:
    """dirs[j][i]: the direction of order j + 1 for float input i (dyadic, exact)."""
    rng = np.random.default_rng(case.seed)
    if case.elementwise and len(case.floats) == 1:
        return [[np.ones_like(case.floats[0])] for _ in range(ORDER)]
    return [
        [np.asarray(rng.choice(DIRECTIONS, size=np.shape(x)), dtype=x.dtype) for x in case.floats]
        for _ in range(ORDER)
    ]


def cotangent(case: Case, value: np.ndarray) -> Any:
    if case.elementwise:
        return None
    rng = np.random.default_rng(case.seed + 1000)
    return np.asarray(rng.choice(DIRECTIONS, size=value.shape), dtype=value.dtype)


_ORACLE: dict[Any, Any] = {}


def expect(case: Case, dirs: Any, u: Any) -> tuple[Any, list[oracle.Expect]]:
    """The oracle at this point, computed once for both dtypes when the inputs agree."""
    key = (
        case.label,
        tuple(np.asarray(x, np.float64).tobytes() for x in case.floats),
        tuple(np.asarray(d, np.float64).tobytes() for level in dirs for d in level),
        None if u is None else np.asarray(u, np.float64).tobytes(),
    )
    if key not in _ORACLE:
        problem = oracle.Problem(
            case.mp_fun,
            [oracle.to_mp(x) for x in case.floats],
            [[oracle.to_mp(d) for d in level] for level in dirs],
            None if u is None else oracle.to_mp(u),
        )
        with np.errstate(all="ignore"):
            _ORACLE[key] = oracle.expect(problem, ORDER)
    return _ORACLE[key]


def _close(got: Any, want: Any, dtype: Any) -> bool:
    if np.isnan(want):
        return bool(np.isnan(got))
    if np.isinf(want):
        return bool(got == want)
    rtol = RTOL[np.dtype(dtype).type]
    return bool(abs(float(got) - float(want)) <= rtol * max(1.0, abs(float(want))))


def check_derivative(got: Any, e: oracle.Expect, dtype: Any) -> str | None:
    """None if `got` is what `e` allows, else why not."""
    got = np.asarray(got).item()
    if e.kind == "value":
        want = oracle.to_float(e.value, dtype)
        if np.isinf(want) and not np.isfinite(got) and not (np.isinf(got) and got != want):
            return None  # beyond the float range: partial derivatives overflow, inf - inf
        return None if _close(got, want, dtype) else f"expected {want!r}"
    if e.kind == "nonfinite":
        if np.isfinite(got):
            return "expected inf or nan (the derivative diverges or is undefined)"
        if e.sign and np.isinf(got) and np.sign(got) != e.sign:
            return f"expected {'+' if e.sign > 0 else '-'}inf (or nan)"
        return None
    if e.kind == "limit":
        if not np.isfinite(got):
            return None
        if e.value is None:
            return "expected inf or nan: no value is right at this non-finite input"
        want = oracle.to_float(e.value, dtype)
        return None if _close(got, want, dtype) else f"expected {want!r} (or inf/nan)"
    raise AssertionError(e.kind)


def _from_mp(v: Any, dtype: Any) -> np.ndarray:
    return np.vectorize(lambda z: oracle.to_float(z, dtype), otypes=[dtype])(v)


def numpy_value(case: Case) -> Any:
    """NumPy's own value, where NumPy has the function (for inf, nan and signed zeros)."""
    if case.name in oracle.VALUE_ONLY:
        return oracle.VALUE_ONLY[case.name](*case.point.args, **case.point.params)
    prim = REGISTRY.get(case.name)
    fn = getattr(np, case.name, None) if prim is not None and prim.ufunc is not None else None
    if prim is not None and prim.special_points and prim.kind == "other":
        fn = getattr(scipy.special, case.name, None)  # a SciPy function (its poles)
    if fn is None or case.name in ("where", "sigmoid", "astype", "stop_gradient"):
        return None
    with np.errstate(all="ignore"):
        return fn(*case.args(case.floats))


def check_value(case: Case, value: Any, mp_value: Any) -> list[str]:
    numpy_like = numpy_value(case)
    if value.dtype.kind != "f":
        if numpy_like is not None and (
            not np.array_equal(value, numpy_like) or value.dtype != np.asarray(numpy_like).dtype
        ):
            return [f"{case.label}: value {value!r}, NumPy says {numpy_like!r}"]
        return []
    if case.elementwise:
        want = oracle.to_float(mp_value, value.dtype)
        if not np.isfinite(want) and numpy_like is not None:
            want = np.asarray(numpy_like).item()
        ok = _close(value.item(), want, value.dtype) and not (
            np.isinf(want) and np.isfinite(value.item())
        )
        return [] if ok else [f"{case.label}: value {value.item()!r}, expected {want!r}"]
    mp_out = np.asarray(case.mp_fun(*[oracle.to_mp(x) for x in case.floats]), dtype=object)
    want = _from_mp(mp_out, value.dtype)
    if want.shape != value.shape:
        return [f"{case.label}: shape {value.shape}, expected {want.shape}"]
    bad = [
        (i, value[i], want[i])
        for i in np.ndindex(value.shape)
        if not _close(value[i], want[i], value.dtype)
    ]
    return [f"{case.label}: value at {i} is {g!r}, expected {w!r}" for i, g, w in bad[:3]]


def _needs_convention(case: Case, k: int) -> str:
    return (
        f"{case.label}: order {k}: the one-sided derivatives differ (a kink, tie or jump) "
        "and no convention covers the point. Name the row of docs/conventions.md that "
        "fixes it, with at(..., convention=...), and test that row in "
        "tests/test_conventions.py."
    )


def _stacked(group: list[Case]) -> tuple[list[Any], list[np.ndarray]]:
    """An elementwise batch's args: the other args (None where a float is differentiated;
    held-fixed floats in the dtype under test) and the differentiated floats, stacked."""
    first = group[0]
    others = [
        None if j in first.where
        else np.stack([c.fixed[j] for c in group]) if j in first.fixed
        else np.array([c.point.args[j] for c in group])
        for j in range(len(first.point.args))
    ]  # fmt: skip
    floats = [np.stack([c.floats[i] for c in group]) for i in range(len(first.where))]
    return others, floats


def check_cases(group: list[Case], dtype: Any, jit: Any = None) -> list[str]:
    """Check points at once: one elementwise batch (the points stacked into arrays,
    derivatives per element), or one array point."""
    first = group[0]
    if first.elementwise:
        others, floats = _stacked(group)

        def fun(*fl: Any) -> Any:
            return first.op(*first.args(fl, others), **first.point.params)

    else:
        assert len(group) == 1
        fun, floats = first.fg_fun, first.floats
    values = np.asarray(fun(*floats))
    failures: list[str] = []
    if values.dtype.kind != "f":
        for i, c in enumerate(group):
            failures += check_value(c, values[i] if first.elementwise else values, None)
        return failures
    if not first.where:  # every float held fixed (riemann_zeta): the value only
        for i, c in enumerate(group):
            with mpmath.workprec(oracle.P1), np.errstate(all="ignore"):
                mp_value = oracle.guard(c.mp_fun)()
            failures += check_value(c, values[i] if first.elementwise else values, mp_value)
        return failures
    us = [cotangent(c, values) for c in group]
    dirs = [directions(c) for c in group]
    expected = [expect(c, d, u) for c, d, u in zip(group, dirs, us, strict=True)]
    for i, (c, (mp_value, _)) in enumerate(zip(group, expected, strict=True)):
        failures += check_value(c, values[i] if first.elementwise else values, mp_value)
    if values.size == 0 or all(np.size(x) == 0 for x in floats):
        return failures + _check_shapes(fun, floats, dirs[0], us[0])
    stacked = [
        [np.stack([d[j][i] for d in dirs]) if first.elementwise else dirs[0][j][i]
         for i in range(len(floats))]
        for j in range(ORDER)
    ]  # fmt: skip
    active = list(range(len(group)))
    for k in range(1, ORDER + 1):
        todo: dict[bool, list[int]] = {}
        for i in list(active):
            c, e = group[i], expected[i][1][k - 1]
            if e.kind == "kink" and c.point.convention is None:
                failures.append(_needs_convention(c, k))
            if e.kind == "kink" or c.point.convention is not None:
                active.remove(i)  # a convention's own test fixes the derivatives here
                continue
            todo.setdefault(e.single, []).append(i)
        for single, which in todo.items():
            level_dirs = [stacked[0]] * k if single else stacked[:k]
            for modes in MODES[k]:
                got = derivative(fun, floats, level_dirs, modes, us[0], jit)
                for i in which:
                    g = got[i] if first.elementwise else got
                    why = check_derivative(g, expected[i][1][k - 1], dtype)
                    if why:
                        failures.append(
                            f"{group[i].label}: order {k} by {'-over-'.join(reversed(modes))}:"
                            f" got {np.asarray(g)!r}, {why}"
                        )
    return failures


def derivative(fun: Any, floats: Any, dirs: Any, modes: Any, u: Any, jit: Any = None) -> Any:
    def run(*xs: Any) -> Any:
        return directional_derivative(fun, xs, dirs, modes, u)

    if jit is not None:
        run = fg.jit(run, fuse=jit)
    return np.asarray(run(*floats))


def _check_shapes(fun: Any, floats: Any, dirs: Any, u: Any) -> list[str]:
    """Size-0 inputs or outputs: every mode runs and gives a scalar."""
    failures = []
    for k in range(1, ORDER + 1):
        for modes in MODES[k]:
            got = derivative(fun, floats, dirs[:k], modes, u)
            if u is not None and got.shape != ():
                failures.append(f"order {k} by {modes}: shape {got.shape}")
    return failures


def groups(name: str, dtype: Any) -> list[list[Case]]:
    """The points of `name`: elementwise ones batched by params, the others one by one."""
    batches: dict[str, list[Case]] = {}
    out = []
    for c in cases(name, dtype):
        if c.elementwise:
            key = repr((sorted(c.point.params.items()), c.where))
            if key not in batches:
                batches[key] = []
                out.append(batches[key])
            batches[key].append(c)
        else:
            out.append([c])
    return out


# ---------------------------------------------------------------- the tests


def _names() -> list[str]:
    """Every primitive and composite once (a primitive called only through a function of
    its own, as debug_print through fg.debug.print, has its points in COMPOSITES)."""
    return sorted(set(REGISTRY) - EXEMPT.keys() - PENDING - COMPOSITES.keys()) + sorted(COMPOSITES)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("name", _names())
def test_value_and_derivatives_at_special_points(name, dtype):
    failures = []
    for group in groups(name, dtype):
        failures += check_cases(group, dtype)
    assert not failures, f"{len(failures)} failure(s):\n" + "\n".join(failures[:40])


# ---------------------------------------------------------------- fused kernels


def _elementwise_batches(dtype: Any) -> list[tuple[str, Any, list[np.ndarray], Any]]:
    """(name, function, stacked float inputs, stacked directions) for every elementwise
    primitive's points (those with float values)."""
    out = []
    for name in sorted(REGISTRY):
        prim = REGISTRY[name]
        if prim.kind != "elementwise" or prim.vjp is None or name in PENDING | EXEMPT.keys():
            continue
        for group in groups(name, dtype):
            first = group[0]
            others, floats = _stacked(group)

            def fun(*fl: Any, _first: Case = first, _others: Any = others) -> Any:
                return _first.op(*_first.args(fl, _others), **_first.point.params)

            dirs = [directions(c) for c in group]
            stacked = [[np.stack([d[j][i] for d in dirs]) for i in range(len(floats))]
                       for j in range(2)]  # fmt: skip
            if np.asarray(fun(*floats)).dtype.kind == "f":
                out.append((name, fun, floats, stacked))
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_fused_kernels_agree_with_the_reference_at_special_points(dtype, patient_watchdog):
    """Every elementwise op's value and derivatives (order 1 reverse, order 2 forward over
    reverse) at its points, in one fused program against the reference interpreter. (Its
    kernels are the suite's largest: with an empty cache on a loaded machine one compiled
    past the 60 s watchdog, and the tests queued behind it in that process ran NumPy.)"""
    batches = _elementwise_batches(dtype)

    def everything(*flat: Any) -> list[Any]:
        outs, it = [], iter(flat)
        for _, fun, floats, dirs in batches:
            xs = [next(it) for _ in floats]
            outs.append(fun(*xs))
            outs.append(directional_derivative(fun, xs, dirs[:1], ("rev",)))
            outs.append(directional_derivative(fun, xs, dirs, ("rev", "fwd")))
        return outs

    flat = [x for _, _, floats, _ in batches for x in floats]
    fused = fg.jit(everything)(*flat)
    reference = fg.jit(everything, fuse=False)(*flat)
    rtol = 4e-6 if dtype == np.float32 else 1e-13
    failures = []
    for k, (f, r) in enumerate(zip(fused, reference, strict=True)):
        name, what = batches[k // 3][0], ("value", "order 1", "order 2")[k % 3]
        f, r = np.asarray(f), np.asarray(r)
        with np.errstate(invalid="ignore", over="ignore"):
            same = (f == r) | (np.isnan(f) & np.isnan(r))
            same |= np.isfinite(r) & (np.abs(f - r) <= rtol * np.maximum(1, np.abs(r)))
        if not np.all(same):
            failures.append(f"{name} {what}: fused {f[~same]}, reference {r[~same]}")
    assert not failures, "\n".join(failures)


# ---------------------------------------------------------------- operands held fixed


@pytest.mark.parametrize("name", sorted(n for n, p in REGISTRY.items() if p.held_fixed))
def test_a_derivative_in_an_operand_held_fixed_raises(name):
    """The audit differentiates the other operands; in these, reverse and forward mode
    raise a ValueError that names the operand (never a silent 0), and hold it fixed
    behind stop_gradient."""
    prim = REGISTRY[name]
    args = [np.float64(a) for a in prim.special_points[0].args]
    for i in prim.held_fixed:

        def f(p: Any, _i: int = i, stop: bool = False) -> Any:
            xs = list(args)
            xs[_i] = fg.stop_gradient(p) if stop else p
            return bind(prim, *xs)

        for run in (fg.grad(f), lambda p: fg.jvp(f, (p,), (np.float64(1.0),))[1]):
            with pytest.raises(ValueError, match=f"{name.removeprefix('riemann_')}: no deriv"):
                run(args[i])
        assert fg.grad(lambda p: f(p, stop=True))(args[i]) == 0.0


# ---------------------------------------------------------------- values only


def _leaves(x: Any) -> list[Any]:
    return [y for item in x for y in _leaves(item)] if isinstance(x, tuple | list) else [x]


def _same_as_numpy(got: Any, want: Any, same: str) -> bool:
    got, want = _leaves(got), _leaves(want)
    if len(got) != len(want):
        return False
    for g, w in zip(got, want, strict=True):
        if isinstance(w, str | np.dtype) or isinstance(w, type):
            if g != w:
                return False
            continue
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape or g.dtype != w.dtype:
            return False
        if same == "value" and not np.array_equal(g, w, equal_nan=w.dtype.kind in "fc"):
            return False
    return True


@pytest.mark.parametrize("name", sorted(VALUES))
def test_values_follow_numpy(name):
    """Eager and traced, the value (dtype, shape) is NumPy's; where the result's shape
    depends on traced values, tracing raises an error naming them; no gradient flows
    through the results (a sum of them, cast to float, adds 0 to x's gradient)."""
    fn, failures = getattr(fnp, name), []
    for k, val in enumerate(VALUES[name]):
        with np.errstate(all="ignore"):
            want = getattr(np, name)(*val.args, **val.kwargs)
            if not _same_as_numpy(fn(*val.args, **val.kwargs), want, val.same):
                failures.append(f"point {k}: eager {fn(*val.args, **val.kwargs)!r}, NumPy {want!r}")
        traced = [i for i, a in enumerate(val.args)
                  if isinstance(a, np.ndarray) and a.dtype.kind in "fiub"
                  and i not in val.static]  # fmt: skip

        def call(*xs: Any, _val: Values = val, _traced: list[int] = traced) -> Any:
            args = list(_val.args)
            for i, x in zip(_traced, xs, strict=True):
                args[i] = x
            return fn(*args, **_val.kwargs)

        if not traced:
            continue
        xs = [val.args[i] for i in traced]
        if val.data_dependent:
            with pytest.raises(TypeError, match="depends on the values"):
                fg.jit(call)(*xs)
            continue
        with np.errstate(all="ignore"):
            got = fg.jit(call)(*xs)
        if not _same_as_numpy(got, want, val.same):
            failures.append(f"point {k}: traced {got!r}, NumPy {want!r}")
        floats = [j for j, x in enumerate(xs) if x.dtype.kind == "f"]
        if floats and val.same == "value":
            j = floats[0]

            def total(x: Any, _xs: list[Any] = xs, _j: int = j, _call: Any = call) -> Any:
                out = _call(*_xs[:_j], x, *_xs[_j + 1 :])
                arrays = [o for o in _leaves(out) if not isinstance(o, int | str | type)]
                return fnp.sum(x) + sum(fnp.sum(fnp.astype(o, x.dtype)) for o in arrays)

            grad = fg.grad(total)(np.where(np.isfinite(xs[j]), xs[j], 0.5))
            if not np.array_equal(grad, np.ones_like(xs[j])):
                failures.append(f"point {k}: a gradient flowed through the results: {grad!r}")
    assert not failures, "\n".join(failures)
