"""Every test in this folder is a reliability family, sized by ``RELIABILITY_PROFILE``."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from wiring import Wired, backend_of

from flowvault.application import SecureObjectStore
from flowvault.application.testing import FrozenClock, SequentialIds
from flowvault.composition import Settings, bootstrap

_HERE = Path(__file__).parent


def _shard() -> tuple[int, int] | None:
    """Return ``(k, n)`` from ``RELIABILITY_SHARD=k/n``, or ``None`` when it is unset."""
    text = os.environ.get("RELIABILITY_SHARD", "").strip()
    if not text:
        return None
    match = re.fullmatch(r"([1-9][0-9]*)/([1-9][0-9]*)", text)
    if match is None or int(match[1]) > int(match[2]):
        raise pytest.UsageError(f"RELIABILITY_SHARD must be k/n with 1 <= k <= n, not {text!r}")
    return int(match[1]), int(match[2])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark this folder's tests ``reliability``; ``RELIABILITY_SHARD=k/n`` keeps every n-th of them.

    Sharding splits a long run (hours of hostile input) into parts that can
    run on several cores or on different days; the shards of one collection
    are disjoint and together hold every test.
    """
    for item in items:
        if _HERE in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.reliability)
    shard = _shard()
    if shard is None:
        return
    k, n = shard
    ours = [item for item in items if _HERE in Path(str(item.path)).parents]
    dropped = {id(item) for position, item in enumerate(ours) if position % n != k - 1}
    config.hook.pytest_deselected(items=[item for item in items if id(item) in dropped])
    items[:] = [item for item in items if id(item) not in dropped]


@pytest.fixture
def wired(backend_store: SecureObjectStore, tmp_path: Path) -> Wired:
    """Bootstrap a runtime over ``backend_store`` with a frozen clock and sequential ids.

    The store fixture owns the store, so the runtime is left for it to close.
    """
    clock = FrozenClock()
    key = bytes(range(32))
    runtime = bootstrap(
        Settings(backend="memory", home=tmp_path / "home"),
        key=key,
        store=backend_store,
        clock=clock,
        ids=SequentialIds("rel"),
    )
    return Wired(runtime, clock, backend_of(backend_store), key)
