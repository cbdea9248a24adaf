"""The label listing and batch load contracts, run on the fallback ``StoreCapabilities`` takes.

A store offering the port alone gets both reads from ``StoreCapabilities``;
the kit holds that fallback to every rule it holds an adapter to, over the
memory and SQLite adapters' ``list`` and ``load`` (the MariaDB contract
module runs it over that adapter's).
"""

from __future__ import annotations

from port_only_reads import PortOnlyReads

from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.application.testing import (
    BatchLoadContract,
    LabelListingContract,
    LabelLoadContract,
)


class TestFallbackOverMemory(LabelListingContract, LabelLoadContract, BatchLoadContract):
    """The fallback over the memory adapter's ``list`` and ``load``."""

    def make_store(self) -> PortOnlyReads:
        return PortOnlyReads(InMemorySecureObjectStore())


class TestFallbackOverSQLite(LabelListingContract, LabelLoadContract, BatchLoadContract):
    """The fallback over the SQLite adapter's ``list`` and ``load``."""

    def make_store(self) -> PortOnlyReads:
        return PortOnlyReads(SQLiteSecureObjectStore.open(self.tmp_path / "s.db", create=True))
