"""MISS: what a fast path answers when the arguments are not the ones it was built for
(runtime.small_call's generated calls), so that the caller takes the general path. A
sentinel of its own, since None can be a function's result; in core, so that
api.jit can test for it without importing the runtime at `import fastgrad`."""


class _Miss:
    def __repr__(self) -> str:
        return "MISS"


MISS = _Miss()
