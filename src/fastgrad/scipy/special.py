"""SciPy's special functions that fastgrad covers, differentiable at every order: the
functions live with their primitives in fastgrad.ops.special and the modules beside it."""

from fastgrad.ops.bessel import iv, ive, j0, j1, jv, k0, k0e, k1, k1e, kv, kve, y0, y1, yv
from fastgrad.ops.entropy import entr, kl_div, rel_entr, xlog1py, xlogy
from fastgrad.ops.log_sum_exp import log_softmax, logsumexp, softmax
from fastgrad.ops.numpy_interop import register_namespace
from fastgrad.ops.special import (
    beta,
    betaln,
    digamma,
    erf,
    erfc,
    erfcinv,
    erfinv,
    expit,
    gamma,
    gammaln,
    i0,
    i0e,
    i1,
    i1e,
    log_expit,
    log_ndtr,
    logit,
    ndtr,
    ndtri,
    polygamma,
    psi,
)
from fastgrad.ops.special_incomplete import (
    betainc,
    betaincinv,
    erfcx,
    gammainc,
    gammaincc,
    gammainccinv,
    gammaincinv,
    stdtr,
    stdtrit,
    zeta,
)

__all__ = [
    "beta", "betainc", "betaincinv", "betaln", "digamma", "entr", "erf", "erfc", "erfcinv",
    "erfcx", "erfinv", "expit", "gamma", "gammainc", "gammaincc", "gammainccinv",
    "gammaincinv", "gammaln", "i0", "i0e", "i1", "i1e", "iv", "ive", "j0", "j1", "jv", "k0",
    "k0e", "k1", "k1e", "kl_div", "kv", "kve", "log_expit", "log_ndtr", "log_softmax",
    "logit", "logsumexp", "ndtr", "ndtri", "polygamma", "psi", "rel_entr", "softmax",
    "stdtr", "stdtrit", "xlog1py", "xlogy", "y0", "y1", "yv", "zeta",
]  # fmt: skip

# scipy.special.erf(x) and the other SciPy ufuncs on a traced x call these.
register_namespace("scipy.special", {name: globals()[name] for name in __all__})
