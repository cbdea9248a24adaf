"""Negative control: the durability contract fails a store that acknowledges before it stores.

The contract's tests are called directly, as plain methods, on a binding to
``BuffersUntilClose``: the kill test must fail with an assertion, and the
reopen-after-close test must pass, so the failure is the missing durability's.
The kill moments are seeded, and every one of them falls after at least one
acknowledgement, so the verdict is the same on every run.
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from nondurable_store import BuffersUntilClose

from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.application import SecureObjectStore
from flowvault.application.testing import DurabilityContract


class _Binding(DurabilityContract):
    """The contract bound to one store class; not collected, its tests are called one by one."""

    def __init__(self, store: type[SQLiteSecureObjectStore]) -> None:
        self.store = store

    def store_factory(self) -> tuple[str, Mapping[str, Any]]:
        self.path = self.tmp_path / "store.db"
        spec = f"{self.store.__module__}:{self.store.__qualname__}.open"
        return spec, {"path": str(self.path), "create": True}

    def open_store(self) -> SecureObjectStore:
        return self.store.open(self.path, create=True)


def test_the_contract_fails_a_store_that_acknowledges_before_it_stores(tmp_path: Path) -> None:
    """Every kill lands after an acknowledgement the store never wrote."""
    with pytest.raises(AssertionError, match="was acknowledged but is missing"):
        _Binding(BuffersUntilClose).test_acknowledged_units_survive_sigkill_whole(tmp_path)


def test_the_control_keeps_everything_on_close(tmp_path: Path) -> None:
    """Closed cleanly, the control loses nothing: its one defect is what the kill test sees."""
    _Binding(BuffersUntilClose).test_a_closed_store_reopens_with_every_unit(tmp_path)
