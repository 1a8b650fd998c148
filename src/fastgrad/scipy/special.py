"""SciPy's special functions that fastgrad covers, differentiable at every order: the
functions live with their primitives in fastgrad.ops.special."""

from fastgrad.ops.numpy_interop import register_namespace
from fastgrad.ops.special import (
    beta,
    betaln,
    digamma,
    entr,
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
    kl_div,
    log_expit,
    log_ndtr,
    log_softmax,
    logit,
    logsumexp,
    ndtr,
    ndtri,
    polygamma,
    psi,
    rel_entr,
    softmax,
    xlog1py,
    xlogy,
)

__all__ = [
    "beta", "betaln", "digamma", "entr", "erf", "erfc", "erfcinv", "erfinv", "expit",
    "gamma", "gammaln", "i0", "i0e", "i1", "i1e", "kl_div", "log_expit", "log_ndtr",
    "log_softmax", "logit", "logsumexp", "ndtr", "ndtri", "polygamma", "psi", "rel_entr",
    "softmax", "xlog1py", "xlogy",
]  # fmt: skip

# scipy.special.erf(x) and the other SciPy ufuncs on a traced x call these.
register_namespace("scipy.special", {name: globals()[name] for name in __all__})
