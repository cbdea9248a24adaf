"""Every test in this folder is a reliability family, sized by ``RELIABILITY_PROFILE``."""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark this folder's tests ``reliability`` so ``make reliability`` can select them."""
    for item in items:
        if _HERE in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.reliability)
