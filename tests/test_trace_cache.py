"""A jitted function keeps at most `config.trace_cache_size` signatures traced, dropping the
least recently used (before: 2049 entries after 2000 shapes, kept for ever)."""

import numpy as np
import pytest

import fastgrad as fg
import fastgrad.numpy as fnp
from fastgrad.core.config import Config, config


@pytest.fixture
def size_4(monkeypatch):
    monkeypatch.setattr(config, "trace_cache_size", 4)


def counting():
    traced = []

    def f(x):
        traced.append(x.shape)
        return fnp.sum(fnp.tanh(x) * x)

    return fg.jit(f), traced


def test_the_cache_is_bounded(size_4):
    f, traced = counting()
    for n in range(1, 41):
        x = np.linspace(-1, 1, n)
        assert np.isclose(f(x), np.sum(np.tanh(x) * x), rtol=1e-13)
    assert len(traced) == 40
    assert len(f._cache) == 4 and len(f._fast) <= 4


def test_the_least_recently_used_signature_goes_first(size_4):
    f, traced = counting()
    xs = [np.ones(n) for n in range(1, 6)]
    for x in xs[:4]:
        f(x)
    f(xs[0])  # the oldest, used again: now the most recent
    f(xs[4])  # a fifth signature: xs[1] is dropped
    assert len(traced) == 5
    f(xs[0])
    f(xs[2])
    assert len(traced) == 5  # still cached
    f(xs[1])
    assert len(traced) == 6  # traced again


def test_pytree_arguments_are_bounded_too(size_4):
    f = fg.jit(lambda p: fnp.sum(p["w"] * p["b"]))
    for n in range(1, 10):
        assert f({"w": np.ones(n), "b": np.full(n, 2.0)}) == 2.0 * n
    assert len(f._cache) == 4


def test_the_setting():
    assert config.trace_cache_size >= 1
    with pytest.raises(ValueError, match="trace_cache_size"):
        config.update("trace_cache_size", 0)
    with pytest.raises(ValueError, match="trace_cache_size"):
        config.update("trace_cache_size", True)


def test_the_environment_variable(monkeypatch):
    monkeypatch.setenv("FASTGRAD_TRACE_CACHE_SIZE", "7")
    assert Config().trace_cache_size == 7
    monkeypatch.setenv("FASTGRAD_TRACE_CACHE_SIZE", "many")
    with pytest.raises(ValueError, match="FASTGRAD_TRACE_CACHE_SIZE"):
        Config()
