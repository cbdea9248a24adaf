"""Controllable clock and ids, and builders for port values, for host tests."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta

from flowvault.application import Guard, Upsert
from flowvault.application._records import ExpectedRevision, LabelValue
from flowvault.domain import EnvelopeHeader, JsonValue, LedgerEvent
from flowvault.domain._envelope import Sensitivity, natural_key_digest
from flowvault.domain._ledger import GENESIS_HASH

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


class FrozenClock:
    """``Clock`` that stands still until a test moves it."""

    def __init__(self, start: datetime = EPOCH) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> datetime:
        """Return the frozen instant."""
        with self._lock:
            return self._now

    def advance(self, delta: timedelta = timedelta(seconds=1)) -> datetime:
        """Move time forward by ``delta`` and return the new instant."""
        with self._lock:
            self._now += delta
            return self._now


class SequentialIds:
    """``IdFactory`` issuing ``prefix-000001``, ``prefix-000002``, ... in order."""

    def __init__(self, prefix: str = "id") -> None:
        self._prefix = prefix
        self._counter = itertools.count(1)
        self._lock = threading.Lock()

    def new_id(self) -> str:
        """Return the next identifier."""
        with self._lock:
            return f"{self._prefix}-{next(self._counter):06d}"


def make_header(
    namespace: str,
    key: str,
    *,
    revision: int = 1,
    written_at: datetime = EPOCH,
    schema_version: int = 1,
    key_id: str = "k1",
    sensitivity: Sensitivity = Sensitivity.CONFIDENTIAL,
    ledger_index: int | None = None,
) -> EnvelopeHeader:
    """Build a header for the record with natural key ``key``."""
    return EnvelopeHeader(
        namespace=namespace,
        key_digest=natural_key_digest(namespace, key),
        sensitivity=sensitivity,
        schema_version=schema_version,
        key_id=key_id,
        revision=revision,
        written_at=written_at,
        ledger_index=ledger_index,
    )


def make_upsert(
    namespace: str,
    key: str,
    payload: bytes = b"sealed",
    *,
    expected: ExpectedRevision = Guard.ABSENT,
    revision: int | None = None,
    labels: Mapping[str, LabelValue] | None = None,
    written_at: datetime = EPOCH,
    ledger_index: int | None = None,
    tags: Iterable[str] = (),
) -> Upsert:
    """Build an upsert whose revision follows from ``expected`` unless given."""
    if revision is None:
        revision = expected + 1 if isinstance(expected, int) else 1
    header = make_header(
        namespace, key, revision=revision, written_at=written_at, ledger_index=ledger_index
    )
    return Upsert(
        header=header,
        payload=payload,
        expected=expected,
        labels=labels or {},
        tags=frozenset(tags),
    )


def make_event(
    stream: str,
    index: int,
    previous: LedgerEvent | None = None,
    *,
    payload: JsonValue = None,
    occurred_at: datetime = EPOCH,
    type: str = "test.event",
) -> LedgerEvent:
    """Build the ledger event at ``index`` chained onto ``previous``."""
    return LedgerEvent.create(
        stream=stream,
        index=index,
        type=type,
        occurred_at=occurred_at,
        payload={"n": index} if payload is None else payload,
        previous_hash=GENESIS_HASH if previous is None else previous.event_hash,
    )
