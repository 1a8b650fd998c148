"""Accuracy, special values and vectorization of fastgrad.compiler.codegen.vecmath.

Every function is evaluated the way a generated kernel calls it: inside a jitted loop
over an array (one loop per function and dtype, compiled once per session). Results are
compared with NumPy in ulps (distance between the integer views of the two floats) and
with a higher-precision reference (long double for float64, float64 for float32).
"""

from __future__ import annotations

import re

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from llvmlite import binding as llvm

from fastgrad.compiler.codegen import vecmath as vm
from fastgrad.compiler.codegen.math_names import BINARY_NAMES, NAMES

DTYPES = [np.float64, np.float32]
CASES = [(name, dt) for name in NAMES for dt in DTYPES]
TRIG = ["sin", "cos", "tan"]
ID = {np.float64: "f64", np.float32: "f32"}

# Allowed distance to NumPy in ulps. Ours is within ~1.05 ulp of the exact result (see
# test_error_vs_high_precision); NumPy's own float32 log and tan are up to ~3.8 ulp off
# on AVX-512 machines, so the distance between the two can exceed 4 there.
TOL_NUMPY = {(name, dt): 4 for name, dt in CASES}
TOL_NUMPY[("log", np.float32)] = 5
TOL_NUMPY[("tan", np.float32)] = 5
# Allowed error against the high-precision reference, in ulps of the exact result (the
# largest measured over millions of inputs is 1.05, float32 tan; most are below 1).
TOL_EXACT = 1.1

HIGH_PRECISION_LONGDOUBLE = np.finfo(np.longdouble).nmant >= 63

# ------------------------------------------------------------------------ evaluation

_LOOPS: dict = {}


def _make_loop(func):
    @numba.njit(error_model="numpy")
    def loop(x, out):
        for i in range(x.size):
            out[i] = func(x[i])

    return loop


def _loop(name, dtype, bounded=False):
    key = (name, dtype, bounded)
    if key not in _LOOPS:
        table = vm.BOUNDED_TRIG if bounded else vm.FUNCTIONS
        _LOOPS[key] = _make_loop(table[(name, np.dtype(dtype).name)])
    return _LOOPS[key]


def evaluate(name, x, bounded=False):
    x = np.ascontiguousarray(x)
    out = np.empty_like(x)
    _loop(name, x.dtype.type, bounded)(x, out)
    return out


def _numpy_sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def numpy_ref(name, x):
    """NumPy's own result in the same dtype (sigmoid: the stable NumPy formula)."""
    with np.errstate(all="ignore"):
        if name == "sigmoid":
            return _numpy_sigmoid(x).astype(x.dtype)
        return getattr(np, name)(x)


def exact_ref(name, x):
    """The function in higher precision (float64 -> long double, float32 -> float64)."""
    wide = np.longdouble if x.dtype == np.float64 else np.float64
    with np.errstate(all="ignore"):  # casting signalling nans warns
        xw = x.astype(wide)
        if name == "sigmoid":
            return _numpy_sigmoid(xw)
        return getattr(np, name)(xw)


def ulp_distance(a, b):
    """Number of representable floats between a and b (0 when both are nan)."""
    assert a.dtype == b.dtype
    itype = np.int64 if a.dtype == np.float64 else np.int32
    ia = a.view(itype).astype(np.int64)
    ib = b.view(itype).astype(np.int64)
    lo = np.iinfo(itype).min
    # map the sign-magnitude bit patterns onto a monotonic integer line (-0 == +0)
    ia = np.where(ia < 0, lo - ia, ia)
    ib = np.where(ib < 0, lo - ib, ib)
    d = np.abs(ia - ib).astype(np.float64)
    both_nan = np.isnan(a) & np.isnan(b)
    one_nan = np.isnan(a) ^ np.isnan(b)
    d[both_nan] = 0
    d[one_nan] = np.inf
    return d


def error_vs_exact(y, ref):
    """|y - ref| in ulps of ref rounded to y's dtype (0 where both are nan / same inf)."""
    with np.errstate(all="ignore"):
        r = ref.astype(y.dtype)
        spacing = np.spacing(np.abs(r)).astype(ref.dtype)
        err = np.abs(y.astype(ref.dtype) - ref) / spacing
    err[np.isnan(y) & np.isnan(r)] = 0
    err[np.isinf(r) & (y == r)] = 0
    err[np.isnan(y) != np.isnan(r)] = np.inf
    return err


def check_against_numpy(name, x, y=None, tol=None):
    y = evaluate(name, x) if y is None else y
    ref = numpy_ref(name, x)
    d = ulp_distance(y, ref)
    tol = TOL_NUMPY[(name, x.dtype.type)] if tol is None else tol
    bad = np.nonzero(d > tol)[0]
    assert bad.size == 0, (
        f"{name} {x.dtype}: {bad.size} values more than {tol} ulp from NumPy, e.g. "
        f"x={x[bad[0]]!r} got {y[bad[0]]!r} numpy {ref[bad[0]]!r} ({d[bad[0]]} ulp)"
    )


# ------------------------------------------------------------------------ domains

# Targeted ranges per function (float64 numbers, clipped to the dtype's range).
TARGETED = {
    "exp": [
        (-1.0, 1.0),
        (-1e-8, 1e-8),
        (700.0, 720.0),
        (-760.0, -700.0),
        (80.0, 100.0),
        (-110.0, -80.0),
    ],
    "expm1": [
        (-1.0, 1.0),
        (-1e-8, 1e-8),
        (-0.4, 0.4),
        (700.0, 720.0),
        (-50.0, -15.0),
        (80.0, 100.0),
    ],
    "log": [(0.5, 2.0), (0.999, 1.001), (0.0, 1e-300), (1e300, 1.8e308), (0.0, 1e-37)],
    "log1p": [(-1.0, 1.0), (-1e-8, 1e-8), (-1.0, -0.999), (1.0, 1e30)],
    "tanh": [(-1.0, 1.0), (-1e-5, 1e-5), (-25.0, 25.0), (-10.0, 10.0)],
    "sin": [(-10.0, 10.0), (-1e-5, 1e-5), (-1e6, 1e6), (1e9, 1e10), (1e15, 1e22)],
    "cos": [(-10.0, 10.0), (-1e-5, 1e-5), (-1e6, 1e6), (1e9, 1e10), (1e15, 1e22)],
    "tan": [(-10.0, 10.0), (-1e-5, 1e-5), (-1.6, 1.6), (-1e6, 1e6), (1e15, 1e22)],
    "sinh": [(-1.0, 1.0), (-1e-5, 1e-5), (-30.0, 30.0), (700.0, 720.0), (80.0, 100.0)],
    "cosh": [(-1.0, 1.0), (-1e-5, 1e-5), (-30.0, 30.0), (700.0, 720.0), (80.0, 100.0)],
    "arctan": [(-1.0, 1.0), (0.3, 0.5), (2.0, 3.0), (-1e-5, 1e-5), (1e10, 1e20)],
    "sigmoid": [(-40.0, 40.0), (-1.0, 1.0), (-760.0, -700.0), (-110.0, -80.0)],
}


def _clip(lo, hi, dtype):
    m = float(np.finfo(dtype).max)
    return min(max(lo, -m), m), min(max(hi, -m), m)


def float_strategy(name, dtype):
    width = 64 if dtype == np.float64 else 32
    parts = [st.floats(allow_nan=False, allow_infinity=False, width=width)]
    for lo, hi in TARGETED[name]:
        lo, hi = _clip(lo, hi, dtype)
        lo, hi = float(dtype(lo)), float(dtype(hi))
        parts.append(st.floats(lo, hi, width=width))
    return st.one_of(*parts)


def sample(name, dtype, n, seed):
    """Deterministic sample: random bit patterns (all floats, incl. inf/nan) plus
    uniform draws from each targeted range."""
    rng = np.random.default_rng(seed)
    itype = np.uint64 if dtype == np.float64 else np.uint32
    parts = [rng.integers(0, np.iinfo(itype).max, n, dtype=itype, endpoint=True).view(dtype)]
    for lo, hi in TARGETED[name]:
        lo, hi = _clip(lo, hi, dtype)
        parts.append(rng.uniform(lo, hi, n // 4).astype(dtype))
    return np.concatenate(parts)


# ------------------------------------------------------------------------ tests


def test_table_is_complete():
    binary = {(n, np.dtype(d).name) for n in BINARY_NAMES for d in DTYPES}  # test_vecmath_power
    assert set(vm.FUNCTIONS) == {(n, np.dtype(d).name) for n, d in CASES} | binary
    assert set(vm.BOUNDED_TRIG) == {(n, np.dtype(d).name) for n in TRIG for d in DTYPES}
    for name, dt in CASES + [(n, d) for n in BINARY_NAMES for d in DTYPES]:
        assert vm.FUNCTIONS[(name, np.dtype(dt).name)] is getattr(vm, f"{name}_{ID[dt]}")


@pytest.mark.parametrize("name,dtype", CASES, ids=[f"{n}-{ID[d]}" for n, d in CASES])
@settings(
    max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(data=st.data())
def test_matches_numpy_hypothesis(name, dtype, data):
    x = data.draw(arrays(dtype, st.integers(1, 48), elements=float_strategy(name, dtype)))
    check_against_numpy(name, x)


@pytest.mark.parametrize("name,dtype", CASES, ids=[f"{n}-{ID[d]}" for n, d in CASES])
def test_matches_numpy_sweep(name, dtype):
    check_against_numpy(name, sample(name, dtype, 40_000, seed=NAMES.index(name)))


@pytest.mark.parametrize("name,dtype", CASES, ids=[f"{n}-{ID[d]}" for n, d in CASES])
def test_error_vs_high_precision(name, dtype):
    if dtype == np.float64 and not HIGH_PRECISION_LONGDOUBLE:
        pytest.skip("long double is not extended: no float64 reference")
    x = sample(name, dtype, 20_000, seed=100 + NAMES.index(name))
    y = evaluate(name, x)
    err = error_vs_exact(y, exact_ref(name, x))
    i = int(np.argmax(err))
    assert err[i] <= TOL_EXACT, f"{name} {dtype}: {err[i]} ulp at x={x[i]!r} -> {y[i]!r}"


def _edge_inputs(dtype):
    fi = np.finfo(dtype)
    vals = [
        0.0,
        -0.0,
        np.inf,
        -np.inf,
        np.nan,
        1.0,
        -1.0,
        0.5,
        -0.5,
        2.0,
        -2.0,
        float(fi.max),
        -float(fi.max),
        float(fi.tiny),
        -float(fi.tiny),
        float(fi.smallest_subnormal),
        -float(fi.smallest_subnormal),
        float(fi.tiny) / 3,
        1e3,
        -1e3,
        1e5,
        -1e5,
        1e-3,
        -1e-3,
        np.pi / 2,
        np.pi,
        3 * np.pi / 2,
    ]
    # thresholds: exp/expm1/sinh/cosh overflow, exp underflow, tanh saturation
    lmax = float(np.log(fi.max))
    lsub = float(np.log(fi.smallest_subnormal))
    for t in (lmax, lmax + np.log(2.0), lsub, float(np.log(fi.tiny)), 19.07, 9.02):
        v = dtype(t)
        vals += [float(np.nextafter(v, -np.inf)), float(v), float(np.nextafter(v, np.inf))]
        vals += [-vals[-1], -vals[-2], -vals[-3]]
    with np.errstate(over="ignore"):
        return np.array(vals, dtype=np.float64).astype(dtype)


@pytest.mark.parametrize("name,dtype", CASES, ids=[f"{n}-{ID[d]}" for n, d in CASES])
def test_edges_match_numpy(name, dtype):
    x = _edge_inputs(dtype)
    y = evaluate(name, x)
    ref = numpy_ref(name, x)
    if name == "sigmoid":  # no NumPy function: the stable formula in wide precision
        ref = exact_ref(name, x).astype(dtype)
    d = ulp_distance(y, ref)
    # inf/nan/zero inputs and nan results must agree exactly, including the sign of zero.
    # Results that over/underflow are compared in ulps: inf is one ulp above the largest
    # float and 0 one below the smallest subnormal, and a result within an ulp of those
    # boundaries may round to either side.
    exact = ~np.isfinite(x) | (x == 0) | np.isnan(ref)
    for i in np.nonzero(exact)[0]:
        assert np.isnan(y[i]) == np.isnan(ref[i]), (name, x[i], y[i], ref[i])
        if not np.isnan(ref[i]):
            assert y[i] == ref[i] and np.signbit(y[i]) == np.signbit(ref[i]), (
                name,
                x[i],
                y[i],
                ref[i],
            )
    tol = TOL_NUMPY[(name, dtype)]
    assert np.all(d <= tol), (name, x[d > tol], y[d > tol], ref[d > tol])


@pytest.mark.parametrize("dtype", DTYPES, ids=ID.get)
def test_special_values(dtype):
    """The cases spelled out: NumPy's answers for infinities, nan, signed zero,
    subnormals and overflow/underflow."""
    fi = np.finfo(dtype)
    inf, nan, sub = np.inf, np.nan, float(fi.smallest_subnormal)
    big = 1000.0

    def ev(name, v):
        return evaluate(name, np.array([v], dtype=dtype))[0]

    def same(a, b):
        return (np.isnan(a) and np.isnan(b)) or (a == b and np.signbit(a) == np.signbit(b))

    expected = {
        "exp": [
            (inf, inf),
            (-inf, 0.0),
            (nan, nan),
            (big, inf),
            (-big, 0.0),
            (0.0, 1.0),
            (-0.0, 1.0),
            (sub, 1.0),
            (-sub, 1.0),
        ],
        "expm1": [
            (inf, inf),
            (-inf, -1.0),
            (nan, nan),
            (big, inf),
            (-big, -1.0),
            (0.0, 0.0),
            (-0.0, -0.0),
            (sub, sub),
            (-sub, -sub),
        ],
        "log": [
            (inf, inf),
            (-inf, nan),
            (nan, nan),
            (0.0, -inf),
            (-0.0, -inf),
            (-1.0, nan),
            (-sub, nan),
            (1.0, 0.0),
        ],
        "log1p": [
            (inf, inf),
            (-inf, nan),
            (nan, nan),
            (-1.0, -inf),
            (-2.0, nan),
            (0.0, 0.0),
            (-0.0, -0.0),
            (sub, sub),
            (-sub, -sub),
        ],
        "tanh": [
            (inf, 1.0),
            (-inf, -1.0),
            (nan, nan),
            (big, 1.0),
            (-big, -1.0),
            (0.0, 0.0),
            (-0.0, -0.0),
            (sub, sub),
            (-sub, -sub),
        ],
        "sin": [
            (inf, nan),
            (-inf, nan),
            (nan, nan),
            (0.0, 0.0),
            (-0.0, -0.0),
            (sub, sub),
            (-sub, -sub),
        ],
        "cos": [(inf, nan), (-inf, nan), (nan, nan), (0.0, 1.0), (-0.0, 1.0), (sub, 1.0)],
        "tan": [
            (inf, nan),
            (-inf, nan),
            (nan, nan),
            (0.0, 0.0),
            (-0.0, -0.0),
            (sub, sub),
            (-sub, -sub),
        ],
        "sinh": [
            (inf, inf),
            (-inf, -inf),
            (nan, nan),
            (big, inf),
            (-big, -inf),
            (0.0, 0.0),
            (-0.0, -0.0),
            (sub, sub),
            (-sub, -sub),
        ],
        "cosh": [
            (inf, inf),
            (-inf, inf),
            (nan, nan),
            (big, inf),
            (-big, inf),
            (0.0, 1.0),
            (-0.0, 1.0),
            (sub, 1.0),
        ],
        "arctan": [
            (nan, nan),
            (0.0, 0.0),
            (-0.0, -0.0),
            (sub, sub),
            (-sub, -sub),
            (inf, float(dtype(np.pi / 2))),
            (-inf, float(dtype(-np.pi / 2))),
        ],
        "sigmoid": [
            (inf, 1.0),
            (-inf, 0.0),
            (nan, nan),
            (0.0, 0.5),
            (-0.0, 0.5),
            (big, 1.0),
            (-big, 0.0),
        ],
    }
    for name, pairs in expected.items():
        for v, want in pairs:
            got = ev(name, v)
            assert same(got, dtype(want)), f"{name}_{ID[dtype]}({v!r}) = {got!r}, want {want!r}"
    # gradual underflow: exp and sigmoid produce correctly rounded-ish subnormals
    x = np.linspace(
        float(np.log(fi.smallest_subnormal)) + 0.5,
        float(np.log(fi.tiny)),
        200,
        endpoint=False,
        dtype=dtype,
    )
    for name in ("exp", "sigmoid"):
        y = evaluate(name, x)
        assert np.all((y > 0) & (y < fi.tiny)), name
        if HIGH_PRECISION_LONGDOUBLE:
            assert np.all(error_vs_exact(y, exact_ref(name, x)) <= TOL_EXACT), name


@pytest.mark.skipif(not HIGH_PRECISION_LONGDOUBLE, reason="needs an extended long double")
@pytest.mark.parametrize("dtype", DTYPES, ids=ID.get)
@pytest.mark.parametrize("name", TRIG)
def test_trig_large_and_hard_arguments(name, dtype):
    """Huge arguments and the floats closest to multiples of pi/2 (found from the
    continued-fraction convergents of 2^s * 2/pi), for both reductions. Judged against
    the long double reference: NumPy's own float64 cos is 8 ulp off at the hardest
    double (6381956970095103 * 2^797), so NumPy is only used where it is accurate."""
    if dtype == np.float64:
        hard = [
            45.553093477052,
            91.106186954104,
            14461176.67027838,
            182.212373908208,
            6381956970095103.0 * 2.0**797,
            1e22,
            2.0**1023,
            1.7976931348623157e308,
            104348.0,
            103993.0,
            355.0,
            2097152.0,
            8.98846567431158e307,
        ]
    else:
        hard = [
            252.89820861816406,
            505.7964172363281,
            42781604.0,
            4.71238899230957,
            7.729178919452902e28,
            21999384576.0,
            1.5458357838905804e29,
            3.4e38,
            65536.0,
            134217728.0,
        ]
    x = np.array(hard, dtype=dtype)
    with np.errstate(over="ignore"):  # nextafter(max, inf) = inf is wanted here
        x = np.concatenate([x, -x, np.nextafter(x, np.inf), np.nextafter(x, 0)])
    exact = exact_ref(name, x)
    y = evaluate(name, x)
    err = error_vs_exact(y, exact)
    assert err.max() <= 1.0, (name, x[np.argmax(err)], y[np.argmax(err)])
    numpy_ok = error_vs_exact(numpy_ref(name, x), exact) <= 1.0
    check_against_numpy(name, x[numpy_ok], y[numpy_ok])
    inside = np.abs(x) < vm.TRIG_BOUNDED_LIMIT
    yb = evaluate(name, x, bounded=True)
    check_bounded_agrees(name, x[inside], yb[inside], y[inside])
    assert np.all(np.isnan(yb[~inside]))


def check_bounded_agrees(name, x, yb, y):
    """The bounded variant against the full-range one: float64's is the same arithmetic
    and gives identical results; float32's reduction runs in float64 (another rounding of
    the reduced argument), so each result is checked against the float64 reference."""
    if x.dtype == np.float64:
        assert np.array_equal(yb, y, equal_nan=True)
        return
    err = error_vs_exact(yb, exact_ref(name, x))
    i = int(np.argmax(err)) if err.size else 0
    assert err.size == 0 or err[i] <= TOL_EXACT, (name, x[i], yb[i], err[i])


@pytest.mark.parametrize("dtype", DTYPES, ids=ID.get)
@pytest.mark.parametrize("name", TRIG)
@settings(
    max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(data=st.data())
def test_bounded_trig_hypothesis(name, dtype, data):
    width = 64 if dtype == np.float64 else 32
    lim = float(np.nextafter(dtype(vm.TRIG_BOUNDED_LIMIT), dtype(0)))
    small = float(dtype(1e-3))
    elems = st.one_of(
        st.floats(-lim, lim, width=width),
        st.floats(-10.0, 10.0, width=width),
        st.floats(-small, small, width=width),
    )
    x = data.draw(arrays(dtype, st.integers(1, 48), elements=elems))
    y = evaluate(name, x, bounded=True)
    check_against_numpy(name, x, y)
    check_bounded_agrees(name, x, y, evaluate(name, x))


@pytest.mark.parametrize("dtype", DTYPES, ids=ID.get)
def test_bounded_trig_outside_limit_is_nan(dtype):
    x = np.array([vm.TRIG_BOUNDED_LIMIT, -vm.TRIG_BOUNDED_LIMIT, 1e20, np.inf, np.nan], dtype=dtype)
    for name in TRIG:
        assert np.all(np.isnan(evaluate(name, x, bounded=True)))


@pytest.mark.parametrize("dtype", DTYPES, ids=ID.get)
def test_scalar_calls_and_argument_conversion(dtype):
    # callable from Python as well; a float64 argument is first converted to the
    # function's dtype (so exp_f32(x) computes in float32 for any x)
    f = vm.FUNCTIONS[("exp", np.dtype(dtype).name)]
    x = np.float64(0.7)
    assert f(x) == evaluate("exp", np.array([x], dtype=dtype))[0]


def _host_has_avx2() -> bool:
    feats = llvm.get_host_cpu_features()
    return bool(feats.get("avx2")) and bool(feats.get("fma"))


_PACKED = re.compile(r"\bv(?:fmadd|fnmadd|fmsub|fnmsub)\w*(p[sd])\s+[^\n]*%([yz])mm")


@pytest.mark.skipif(not _host_has_avx2(), reason="host CPU lacks AVX2/FMA: no packed code")
@pytest.mark.skipif(
    numba.config.CPU_NAME not in (None, "host"), reason="NUMBA_CPU_NAME targets another CPU"
)
@pytest.mark.parametrize("name", ["exp", "sin", "tanh", "log"])
@pytest.mark.parametrize("dtype", DTYPES, ids=ID.get)
def test_loop_vectorizes(name, dtype):
    """The loop body compiles to packed AVX2/AVX-512 FMAs on ymm/zmm registers, i.e.
    LLVM vectorized the loop (a scalar libm call would prevent that)."""
    loop = _loop(name, dtype)
    x = np.linspace(0.1, 3.0, 64, dtype=dtype)
    loop(x, np.empty_like(x))
    asm = loop.inspect_asm(loop.signatures[0])
    kinds = {m.group(1) for m in _PACKED.finditer(asm)}
    assert ("pd" if dtype == np.float64 else "ps") in kinds, "no packed FMA in the loop"


@pytest.mark.parametrize("name", NAMES)
def test_float32_stays_float32(name):
    """No float64 arithmetic or float32->float64 conversion in the float32 loop: float32
    computes in float32 lanes, twice float64's per vector."""
    loop = _loop(name, np.float32)
    x = np.linspace(0.1, 3.0, 8, dtype=np.float32)
    loop(x, np.empty_like(x))
    ir = loop.inspect_llvm(loop.signatures[0])
    assert not re.search(
        r"= (?:fadd|fsub|fmul|fdiv|frem)(?: \w+)* double|fpext|"
        r"@llvm\.\w+\.f64\(",
        ir,
    )
