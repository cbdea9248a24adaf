"""Every test in this folder is a reliability family, sized by ``RELIABILITY_PROFILE``."""

from __future__ import annotations

from pathlib import Path

import pytest
from wiring import Wired, backend_of

from flowvault.application import SecureObjectStore
from flowvault.application.testing import FrozenClock, SequentialIds
from flowvault.composition import Settings, bootstrap

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark this folder's tests ``reliability`` so ``make reliability`` can select them."""
    for item in items:
        if _HERE in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.reliability)


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
