"""fastgrad.numpy functions whose results are integers, booleans, shapes or dtypes (or that
have no derivative): NumPy's own value is their oracle. VALUES lists each one's points:
ties, edges, signed zeros, infinities and nan, size-0 and size-1 axes.

tests/test_special_points.py checks each, eager and traced, and that no gradient flows
through the results; it counts these names as covered.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

inf, nan = np.inf, np.nan


@dataclass
class Values:
    """One call: `args` and `kwargs` as NumPy takes them. Traced (under fg.jit) are the
    float and integer arrays among `args` except `static` ones; with `data_dependent` the
    result's shape depends on their values, and tracing them must raise an error that says
    so. `same` compares results: "value" (values, dtypes and shapes) or "shape"."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    static: tuple[int, ...] = ()
    data_dependent: bool = False
    same: str = "value"


def v(*args: Any, static: tuple[int, ...] = (), data_dependent: bool = False,
      same: str = "value", **kwargs: Any) -> Values:  # fmt: skip
    return Values(args, kwargs, static, data_dependent, same)


_V = np.array([[1.5, -2.0, 0.5], [3.0, 0.0, -1.0]])
_SIGNED = np.array([-0.0, 0.0, -1.0, 2.0, inf, -inf, nan])
_EMPTY = np.zeros((0, 3))
_TIES = np.array([3.0, 1.0, 3.0, nan, -0.0, 0.0, nan])
_EYE = np.eye(3)

VALUES: dict[str, tuple[Values, ...]] = {
    "all": (v(_V > 0), v(_V, axis=1), v(_EMPTY, axis=0), v(_SIGNED)),
    "any": (v(_V > 0), v(_V, axis=0, keepdims=True), v(_EMPTY, axis=1), v(_SIGNED)),
    "count_nonzero": (v(_V), v(_V > 0, axis=1), v(_SIGNED), v(_EMPTY, axis=0)),
    "isclose": (v(_V, _V * (1 + 1e-9)), v(_SIGNED, _SIGNED[::-1]),
                v(_SIGNED, _SIGNED, equal_nan=True), v(_V, 0.5, atol=1.0)),
    "allclose": (v(_V, _V + 1e-12), v(_SIGNED, _SIGNED), v(_SIGNED, _SIGNED, equal_nan=True)),
    "array_equal": (v(_V, _V), v(_V, _V[:1]), v(_SIGNED, _SIGNED),
                    v(_SIGNED, _SIGNED, equal_nan=True)),
    "array_equiv": (v(_V, _V[0]), v(_V, _V[:1] + 1.0), v(_V, _V[:, :2])),
    "isin": (v(_V, np.array([0.5, 3.0, -0.0])), v(_SIGNED, _SIGNED[:3], invert=True)),
    "isneginf": (v(_SIGNED),),
    "isposinf": (v(_SIGNED),),
    "signbit": (v(_SIGNED), v(_V)),
    "iscomplex": (v(_V), v(np.array([1 + 0j, 1j]))),
    "isreal": (v(_V), v(np.array([1 + 0j, 1j]))),
    "iscomplexobj": (v(_V), v(np.array([1 + 0j]))),
    "isrealobj": (v(_V), v(np.array([1 + 0j]))),
    "isscalar": (v(2.5), v(_V), v(np.float64(2.0), static=(0,))),
    # Ties go to the first; nan is skipped.
    "nanargmax": (v(_TIES), v(_V, axis=1), v(np.array([[nan, 1.0], [2.0, 2.0]]), axis=1)),
    "nanargmin": (v(_TIES), v(_V, axis=0), v(np.array([[nan, 1.0], [2.0, 2.0]]), axis=1)),
    "digitize": (v(_V, np.array([-1.0, 0.5, 2.0]), static=(1,)),
                 v(_SIGNED, np.array([0.0, 2.0]), right=True, static=(1,)),
                 v(_V, np.array([2.0, 0.5, -1.0]), static=(1,))),
    "ndim": (v(_V), v(np.array(2.5)), v(_EMPTY)),
    "shape": (v(_V), v(np.array(2.5)), v(_EMPTY)),
    "size": (v(_V), v(_V, 1), v(_EMPTY)),
    # (Results that are dtypes and strings are not values a traced function returns.)
    "result_type": (v(_V, np.float32, static=(0,)), v(np.float32(1.0), 2.0),
                    v(np.arange(3), 1.5, static=(0,))),
    "empty_like": (v(_V, same="shape"), v(_V, dtype=np.float32, same="shape")),
    "arange": (v(5), v(1.0, 2.0, 0.25), v(0), v(3, -1, -1)),
    "full": (v((2, 3), 7), v((0,), True)),
    "diag_indices_from": (v(_EYE),),
    "tril_indices_from": (v(_EYE), v(_EYE, 1), v(np.ones((2, 4)), -1)),
    "triu_indices_from": (v(_EYE), v(_EYE, -1), v(np.ones((2, 4)), 1)),
    "unravel_index": (v(np.array([4, 1, 0]), (2, 3)), v(5, (2, 3)), v(np.array([], int), (2, 3)),
                      v(np.array([4, 1, 0]), (2, 3), order="F")),
    "ravel_multi_index": (v((np.array([0, 1]), np.array([2, 0])), (2, 3)),
                          v((np.array([1]), np.array([2])), (2, 3)),
                          v((np.array([3, -1]), np.array([4, 1])), (2, 3), mode="wrap"),
                          v((np.array([3, -1]), np.array([4, 1])), (2, 3), mode=("clip", "wrap"),
                            order="F")),
    "einsum_path": (v("ij,jk->ik", _V, _V.T, static=(1, 2)),
                    v("ij,jk,kl->il", _V, _V.T, _V, optimize="greedy", static=(1, 2, 3))),
    # Results whose shape depends on the values: eager only, and tracing raises.
    "nonzero": (v(_V, data_dependent=True), v(_SIGNED, data_dependent=True)),
    "flatnonzero": (v(_V, data_dependent=True),),
    "argwhere": (v(_V, data_dependent=True), v(_EMPTY, data_dependent=True)),
    "unique": (v(_TIES, data_dependent=True),
               v(_TIES, return_counts=True, return_index=True, data_dependent=True)),
    "union1d": (v(_TIES, _V[0], data_dependent=True),),
    "intersect1d": (v(_TIES, np.array([3.0, -0.0, nan]), data_dependent=True),),
    "setdiff1d": (v(_TIES, np.array([3.0, 0.0]), data_dependent=True),),
    "setxor1d": (v(_TIES, np.array([3.0, 5.0]), data_dependent=True),),
    "bincount": (v(np.array([0, 2, 2, 5]), data_dependent=True),
                 v(np.array([1, 1]), minlength=4, data_dependent=True)),
}  # fmt: skip
