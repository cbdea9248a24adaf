"""The high-water mark and dropped streams: forgotten when dropped, accepted gone only with proof.

A drop committed through the mark's store decorator is written to the log
and forgotten. A stream the mark remembers that is gone from the store, or
shorter, opens only if a keyed ``ledger.dropped`` event names it at or past
the size remembered; a drop without one (rows deleted by someone without
the key), or with one the key did not make, is ``STORE_ROLLED_BACK``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest
from log_capture import capture_logs

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.memory import InMemorySecureObjectStore as InMemoryStore
from flowvault.adapters.system import MarkFileStore
from flowvault.application import LedgerDrop, UnitOfWork, drop_unit
from flowvault.application._anti_rollback import COMPACT_SLACK, AntiRollback
from flowvault.application._high_water_store import HighWaterStore
from flowvault.application._keys import KeyRing
from flowvault.application._mark_flusher import MarkFlusher
from flowvault.application._mark_format import apply_line, parse_mark, replay_log
from flowvault.application._sealed import CipherDigester
from flowvault.application._streams import keyed
from flowvault.application.testing import FrozenClock, make_event
from flowvault.domain import LedgerEvent, StoreRolledBack

KEY = CipherDigester(AesGcmCipher.from_ring(KeyRing(primary=bytes(range(32)))))
STRANGER = CipherDigester(AesGcmCipher.from_ring(KeyRing(primary=bytes(range(1, 33)))))
NOW = FrozenClock().now()


class MemoryStore(InMemoryStore):
    """A memory store that outlives ``close``, so a test can open it again as a file is."""

    def close(self) -> None:
        """Keep the contents: closing the decorator writes the mark, and the store stays."""


def _guard(path: Path, store: MemoryStore) -> AntiRollback:
    return AntiRollback(store, MarkFileStore(path), KEY)


def _guarded(path: Path, store: MemoryStore, *, lagged: bool = False) -> HighWaterStore:
    guard = _guard(path, store)
    guard.check()
    return HighWaterStore(store, guard, MarkFlusher(guard, window=0.05) if lagged else None)


def _sizes(path: Path) -> dict[str, int]:
    state = MarkFileStore(path).read()
    assert state is not None
    return replay_log(parse_mark(state.head, KEY, ""), state.log(), KEY, "")


def _log_lines(path: Path) -> list[dict[str, int]]:
    state = MarkFileStore(path).read()
    assert state is not None
    return [json.loads(line) for line in state.log().splitlines()]


def _grow(store: HighWaterStore | MemoryStore, stream: str, count: int) -> None:
    """Append ``count`` keyed events to ``stream`` in one unit."""
    head = store.ledger_head(stream)
    events: list[LedgerEvent] = []
    for _ in range(count):
        index = 0 if head is None else head.index + 1
        head = keyed(make_event(stream, index, head), KEY)
        events.append(head)
    store.commit(UnitOfWork(appends=events))


def _reopen(path: Path, store: MemoryStore) -> int:
    return _guard(path, store).check()


@pytest.mark.parametrize("lagged", [False, True], ids=["strict", "lagged"])
def test_a_drop_through_the_decorator_is_forgotten(tmp_path: Path, lagged: bool) -> None:
    """The mark's log records the drop; the stream is no longer remembered, and the store opens."""
    store, path = MemoryStore(), tmp_path / "mark"
    guarded = _guarded(path, store, lagged=lagged)
    _grow(guarded, "a", 3)
    _grow(guarded, "b", 2)
    guarded.commit(drop_unit(store, KEY, "a", occurred_at=NOW, reason="test"))
    guarded.close()
    assert _sizes(path) == {"b": 2, "flowvault/dropped": 1}
    _reopen(path, store)
    assert "a" not in _sizes(path)


def test_a_drop_and_a_restart_in_one_window_keep_the_new_size(tmp_path: Path) -> None:
    """Noted in one batch, a drop then the stream's new events read back as the new size."""
    store, path = MemoryStore(), tmp_path / "mark"
    guard = _guard(path, store)
    guard.check()
    guard.advance({"s": 9, "t": 4})
    guard.note({}, dropped=["s", "t"])
    guard.note({"s": 1})
    guard.note({"s": 2})
    guard.advance()
    assert _log_lines(path)[-1] == {"s": -2, "t": 0}
    assert _sizes(path) == {"s": 2}
    guard.note({"s": 7})
    guard.note({}, dropped=["s"])
    guard.advance()
    assert _sizes(path) == {}


def test_apply_line_reads_sizes_drops_and_restarts() -> None:
    """Positive sizes only rise; 0 forgets; -n forgets, then remembers n."""
    sizes = {"a": 5, "b": 5, "c": 5}
    apply_line(sizes, {"a": 3, "b": 0, "c": -2, "d": 4, "e": 0})
    assert sizes == {"a": 5, "c": 2, "d": 4}


def test_a_drop_on_record_outside_the_decorator_opens_and_is_forgotten(tmp_path: Path) -> None:
    """Dropped straight in the store with its registry event, the stream opens and is forgotten."""
    store, path = MemoryStore(), tmp_path / "mark"
    guarded = _guarded(path, store)
    _grow(guarded, "a", 3)
    _grow(guarded, "b", 1)
    guarded.close()
    store.commit(drop_unit(store, KEY, "a", occurred_at=NOW, reason="test"))
    with capture_logs() as logs:
        _reopen(path, store)
    assert "high_water_mark_drops_accepted" in [entry["event"] for entry in logs]
    assert "a" not in _sizes(path)
    _reopen(path, store)


def test_a_drop_without_its_registry_event_is_refused(tmp_path: Path) -> None:
    """A stream deleted without the keyed event (as an editor without the key would) is refused."""
    store, path = MemoryStore(), tmp_path / "mark"
    guarded = _guarded(path, store)
    _grow(guarded, "a", 3)
    _grow(guarded, "b", 1)
    guarded.close()
    store.commit(UnitOfWork(drops=[LedgerDrop("a", 2)]))
    with pytest.raises(StoreRolledBack) as refused:
        _reopen(path, store)
    assert refused.value.details["stream"] == "a"
    assert refused.value.details["size"] == 0
    assert _sizes(path)["a"] == 3, "a refused open forgets nothing"


def test_a_registry_event_the_key_did_not_make_proves_nothing(tmp_path: Path) -> None:
    """A drop recorded under another key is refused as if there were no event."""
    store, path = MemoryStore(), tmp_path / "mark"
    guarded = _guarded(path, store)
    _grow(guarded, "a", 3)
    guarded.close()
    store.commit(drop_unit(store, STRANGER, "a", occurred_at=NOW, reason="test"))
    with pytest.raises(StoreRolledBack):
        _reopen(path, store)


def test_an_old_drop_does_not_excuse_a_longer_later_stream(tmp_path: Path) -> None:
    """A drop event naming index 2 cannot excuse the loss of a stream the mark saw at size 5."""
    store, path = MemoryStore(), tmp_path / "mark"
    _grow(store, "a", 3)
    store.commit(drop_unit(store, KEY, "a", occurred_at=NOW, reason="test"))
    guarded = _guarded(path, store)
    _grow(guarded, "a", 5)
    guarded.close()
    store.commit(UnitOfWork(drops=[LedgerDrop("a", 4)]))
    with pytest.raises(StoreRolledBack) as refused:
        _reopen(path, store)
    assert refused.value.details["high_water"] == 5


def test_a_stream_dropped_and_started_again_behind_the_mark_opens(tmp_path: Path) -> None:
    """Dropped on record and restarted shorter, as a mark written late would find it, it opens."""
    store, path = MemoryStore(), tmp_path / "mark"
    guarded = _guarded(path, store)
    _grow(guarded, "a", 6)
    guarded.close()
    store.commit(drop_unit(store, KEY, "a", occurred_at=NOW, reason="test"))
    _grow(store, "a", 2)
    _reopen(path, store)
    assert _sizes(path)["a"] == 2


def test_an_old_drop_still_excuses_a_shorter_later_stream(tmp_path: Path) -> None:
    """The stated limit: an old drop event covers a later stream of the same name as short.

    A stream started again under a dropped name, then deleted without the
    key while no longer than it was when dropped, opens.
    """
    store, path = MemoryStore(), tmp_path / "mark"
    guarded = _guarded(path, store)
    _grow(guarded, "a", 6)
    guarded.commit(drop_unit(store, KEY, "a", occurred_at=NOW, reason="test"))
    _grow(guarded, "a", 3)
    guarded.close()
    assert _sizes(path)["a"] == 3
    store.commit(UnitOfWork(drops=[LedgerDrop("a", 2)]))
    _reopen(path, store)
    assert "a" not in _sizes(path)


def _compacted_size(sizes: Mapping[str, int]) -> int:
    return len(json.dumps(dict(sizes), separators=(",", ":"))) + 1


def test_dropping_most_streams_compacts_the_log(tmp_path: Path) -> None:
    """Once the drops outweigh what is remembered, the log is compacted, at commit and on open."""
    store, path = MemoryStore(), tmp_path / "mark"
    names = [f"langgraph/{n:064x}" for n in range(2_000)]
    guarded = _guarded(path, store)
    for start in range(0, len(names), 200):
        guarded.commit(
            UnitOfWork(appends=[make_event(name, 0) for name in names[start : start + 200]])
        )
    guarded.close()
    _reopen(path, store)
    state = MarkFileStore(path).read()
    assert state is not None
    full = state.log_size
    guarded = _guarded(path, store)
    for start in range(0, 1_900, 200):
        batch = names[start : min(start + 200, 1_900)]
        guarded.commit(drop_unit(store, KEY, *batch, occurred_at=NOW, reason="test"))
    guarded.close()
    kept = _sizes(path)
    assert set(kept) == {*names[1_900:], "flowvault/dropped"}
    state = MarkFileStore(path).read()
    assert state is not None
    assert state.log_size < full, "the log was compacted while the streams were dropped"
    _reopen(path, store)
    state = MarkFileStore(path).read()
    assert state is not None
    assert state.log_size <= 2 * _compacted_size(kept) + COMPACT_SLACK
