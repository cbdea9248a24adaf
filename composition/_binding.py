"""Binding a host's runtime for its lifetime, so code deep in the host can resolve it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from flowvault.composition._bootstrap import Runtime
from flowvault.domain import NotBound

_lock = threading.Lock()
_bound: list[Runtime] = []


@contextmanager
def bind(runtime: Runtime) -> Iterator[Runtime]:
    """Make ``runtime`` the one ``bound()`` returns until the block ends.

    Process-wide rather than per context, so threads a host starts inside
    the block resolve the same runtime. Bindings nest; the innermost wins.
    """
    with _lock:
        _bound.append(runtime)
    try:
        yield runtime
    finally:
        with _lock:
            del _bound[len(_bound) - 1 - _bound[::-1].index(runtime)]


def bound() -> Runtime:
    """Return the innermost bound runtime; ``NotBound`` when the host bound none."""
    with _lock:
        if not _bound:
            raise NotBound(
                "no flowvault runtime is bound: wrap the host's lifetime in "
                "flowvault.composition.bind(bootstrap(...))"
            )
        return _bound[-1]
