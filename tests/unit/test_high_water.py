"""The high-water mark: its MAC'd head and log, the refusal of an older store, and its file."""

from __future__ import annotations

import os
import stat
import struct
import subprocess
import sys
import threading
import zlib
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

import pytest
from log_capture import capture_logs

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.memory import InMemorySecureObjectStore as MemoryStore
from flowvault.adapters.system import MarkFileStore
from flowvault.adapters.system._mark_file import LOG_OFFSET, SLOT_BYTES
from flowvault.application import UnitOfWork
from flowvault.application._anti_rollback import COMPACT_SLACK, AntiRollback
from flowvault.application._high_water_store import HighWaterStore
from flowvault.application._keys import KeyRing
from flowvault.application._mark_flusher import MarkFlusher
from flowvault.application._mark_format import (
    HighWaterMark,
    MarkState,
    MarkWrite,
    format_mark,
    parse_mark,
    replay_log,
)
from flowvault.application._sealed import CipherDigester
from flowvault.application.testing import make_event
from flowvault.composition._settings import postgres_mark_name
from flowvault.domain import (
    InsecurePermissions,
    IntegrityFailure,
    LedgerEvent,
    StoreRolledBack,
    StoreUnavailable,
)

KEY = CipherDigester(AesGcmCipher.from_ring(KeyRing(primary=bytes(range(32)))))
OTHER = CipherDigester(AesGcmCipher.from_ring(KeyRing(primary=bytes(range(64, 96)))))


class Counter:
    """A store whose count a test sets and whose streams are all empty."""

    def __init__(self, epoch: int = 0) -> None:
        self.value = epoch

    def epoch(self) -> int:
        """Return the count the test set."""
        return self.value

    def ledger_head(self, stream: str) -> LedgerEvent | None:
        """No stream holds events."""
        return None


class HeadsOnly:
    """A store offering only ``epoch`` and ``ledger_head``: no batch lookup, no stream list."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store

    def epoch(self) -> int:
        """Forward to the store."""
        return self._store.epoch()

    def ledger_head(self, stream: str) -> LedgerEvent | None:
        """Forward to the store."""
        return self._store.ledger_head(stream)


class HeadIndexOnly(HeadsOnly):
    """A store with ``ledger_head_index`` (``StreamHeads``) but no batch lookup."""

    def ledger_head_index(self, stream: str) -> int | None:
        """Forward to the store."""
        return self._store.ledger_head_index(stream)


def _guard(
    path: Path, store: Counter | MemoryStore | HeadsOnly, digester: CipherDigester = KEY
) -> AntiRollback:
    return AntiRollback(store, MarkFileStore(path), digester)


def _mark(path: Path) -> HighWaterMark:
    state = MarkFileStore(path).read()
    assert state is not None
    return parse_mark(state.head, KEY, "")


def _sizes(path: Path) -> dict[str, int]:
    state = MarkFileStore(path).read()
    assert state is not None
    return replay_log(parse_mark(state.head, KEY, ""), state.log(), KEY, "")


def _grow(store: MemoryStore, stream: str, count: int) -> None:
    """Append ``count`` events to ``stream`` in one unit."""
    head = store.ledger_head(stream)
    first = 0 if head is None else head.index + 1
    events: list[LedgerEvent] = []
    for index in range(first, first + count):
        events.append(make_event(stream, index, events[-1] if events else head))
    store.commit(UnitOfWork(appends=events))


def _guarded(path: Path, store: MemoryStore) -> HighWaterStore:
    guard = _guard(path, store)
    guard.check()
    return HighWaterStore(store, guard)


def test_a_head_round_trips_and_only_under_its_key() -> None:
    """The text names the epoch, the log's line count, base size and chain, and a MAC."""
    mark = HighWaterMark(42, 3, "sha256:" + "ab" * 32, 120)
    text = format_mark(mark, KEY)
    assert text.startswith(b"flowvault high-water mark 2\nepoch 42\nlog 3 120 sha256:abab")
    assert parse_mark(text, KEY, "here") == mark
    for forged in (
        text.replace(b"epoch 42", b"epoch 43"),
        text.replace(b"log 3 ", b"log 2 "),
        text.replace(b" 120 ", b" 0 "),
        text.replace(b"sha256:abab", b"sha256:abac"),
        text[:-2] + b"0\n",
        b"",
        b"\xff" * 10,
        text + b"extra\n",
        format_mark(mark, OTHER),
    ):
        with pytest.raises(IntegrityFailure, match="does not verify under the store key"):
            parse_mark(forged, KEY, "here")


def test_an_epoch_only_head_is_refused() -> None:
    """A head of the pre-release epoch-only format fails like any malformed head, MAC or not."""
    mac = KEY.keyed_digest("flowvault.high-water/1", b'["flowvault high-water mark 1",7]')
    text = f"flowvault high-water mark 1\nepoch 7\nmac {mac}\n".encode()
    for head in (text, text.replace(b"epoch 7", b"epoch 8")):
        with pytest.raises(IntegrityFailure, match="does not verify under the store key"):
            parse_mark(head, KEY, "")


def test_an_older_store_is_refused_and_a_newer_one_moves_the_mark(tmp_path: Path) -> None:
    """Below the mark: STORE_ROLLED_BACK, naming both counts; at or above: the mark follows."""
    path = tmp_path / "keys" / "store.high-water"
    store = Counter(5)
    with capture_logs() as logs:
        assert _guard(path, store).check() == 0
    assert [entry["event"] for entry in logs] == ["high_water_mark_started"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    store.value = 9
    assert _guard(path, store).check() == 5
    assert _mark(path).epoch == 9
    store.value = 7
    with pytest.raises(StoreRolledBack) as refused:
        _guard(path, store).check()
    assert refused.value.details == {"epoch": 7, "high_water": 9}
    assert "an older copy of the database was restored" in refused.value.message
    previous, current = _guard(path, store).accept()
    assert (previous, current) == (9, 7)
    assert _guard(path, store).check() == 7


def test_the_mark_never_goes_down_whoever_advances_it(tmp_path: Path) -> None:
    """Two processes share the file: the one that saw less cannot lower it."""
    path = tmp_path / "mark"
    _guard(path, Counter(10)).advance({"a": 5})
    _guard(path, Counter(3)).advance({"a": 2, "b": 1})
    assert _mark(path).epoch == 10
    assert _sizes(path) == {"a": 5, "b": 1}


def test_a_stream_cut_short_is_refused_even_with_its_count_raised(tmp_path: Path) -> None:
    """Deleting a stream's newest events and setting the count high again is still seen."""
    path = tmp_path / "mark"
    live = MemoryStore()
    guarded = _guarded(path, live)
    _grow(live, "workflow/a", 3)
    _grow(live, "workflow/b", 2)
    for stream in ("workflow/a", "workflow/b"):
        head = live.ledger_head(stream)
        assert head is not None
        guarded.commit(UnitOfWork(appends=[make_event(stream, head.index + 1, head)]))
    assert _sizes(path) == {"workflow/a": 4, "workflow/b": 3}
    cut = MemoryStore()
    _grow(cut, "workflow/a", 4)
    _grow(cut, "workflow/b", 1)
    for _ in range(50):
        _grow(cut, "padding", 1)
    assert cut.epoch() > live.epoch()
    for store in (cut, HeadsOnly(cut), HeadIndexOnly(cut)):
        with pytest.raises(StoreRolledBack) as refused:
            _guard(path, store).check()
        assert refused.value.details == {
            "stream": "workflow/b",
            "size": 1,
            "high_water": 3,
            "streams": 1,
        }
    assert _guard(path, live).check() == live.epoch()


def test_a_missing_mark_starts_from_every_stream_the_store_holds(tmp_path: Path) -> None:
    """The first open records the store as it is, so a later cut is caught at once."""
    path = tmp_path / "mark"
    store = MemoryStore()
    for name in ("x", "y", "z"):
        _grow(store, name, 2)
    _guard(path, store).check()
    assert _sizes(path) == {"x": 2, "y": 2, "z": 2}
    shorter = MemoryStore()
    _grow(shorter, "x", 2)
    _grow(shorter, "y", 2)
    for _ in range(9):
        _grow(shorter, "other", 1)
    with pytest.raises(StoreRolledBack, match="ledger stream z holds 0 events"):
        _guard(path, shorter).check()


def test_a_mark_file_of_epoch_only_slots_is_refused(tmp_path: Path) -> None:
    """A mark file of the pre-release slot format holds no intact head: it is refused, untouched."""
    path = tmp_path / "mark"
    mac = KEY.keyed_digest("flowvault.high-water/1", b'["flowvault high-water mark 1",3]')
    content = f"flowvault high-water mark 1\nepoch 3\nmac {mac}\n".encode()
    slot = struct.pack(">4sQII", b"FVHW", 1, len(content), zlib.crc32(content)) + content
    path.write_bytes(slot.ljust(2 * SLOT_BYTES, b"\0"))
    path.chmod(0o600)
    before = path.read_bytes()
    store = MemoryStore()
    _grow(store, "s", 3)
    with pytest.raises(IntegrityFailure, match="does not verify under the store key"):
        _guard(path, store).check()
    assert path.read_bytes() == before


def test_an_edited_log_is_refused(tmp_path: Path) -> None:
    """Lines dropped, changed, reordered or added without the key fail the head's chain."""
    path = tmp_path / "mark"
    guard = _guard(path, Counter(1))
    for size in (1, 2, 3):
        guard.advance({"s": size})
    state = MarkFileStore(path).read()
    assert state is not None
    mark = parse_mark(state.head, KEY, "")
    lines = state.log().splitlines(keepends=True)
    assert len(lines) == mark.records == 3
    for edited in (
        b"".join(lines[:-1]),
        b"".join([*lines[:-1], b'{"s":9}\n']),
        b"".join(reversed(lines)),
        b"".join([*lines, b'{"s":9}\n']),
        b"".join(lines)[:-1],
    ):
        with pytest.raises(IntegrityFailure, match="log was edited"):
            replay_log(mark, edited, KEY, "")
    MarkFileStore(path).update(
        lambda current: MarkWrite(current.head, b'{"s":1}\n') if current else None
    )
    with pytest.raises(IntegrityFailure, match="log was edited"):
        _guard(path, Counter(1)).check()


def test_the_log_is_compacted_and_keeps_every_size(tmp_path: Path) -> None:
    """Past twice its compacted size plus the slack, the log becomes one line of all sizes."""
    path = tmp_path / "mark"
    guard = _guard(path, Counter(1))
    names = [f"run/{n:04d}-{'x' * 40}" for n in range(1_500)]
    for n, name in enumerate(names):
        guard.advance({name: n + 1})
    state = MarkFileStore(path).read()
    assert state is not None
    mark = parse_mark(state.head, KEY, "")
    assert mark.records < len(names), "the log was compacted at least once"
    assert state.log_size <= 2 * mark.base + COMPACT_SLACK + 200
    assert _sizes(path) == {name: n + 1 for n, name in enumerate(names)}
    assert path.stat().st_size == LOG_OFFSET + state.log_size
    assert not path.with_name(path.name + ".new").exists()


def test_short_writes_are_finished_not_left_torn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pwrite`` may write less than asked; appends, slots and compactions still land whole."""
    real = os.pwrite
    calls: list[int] = []

    def short(fd: int, data: bytes | memoryview, offset: int) -> int:
        calls.append(len(data))
        return real(fd, bytes(data[:7]), offset)

    monkeypatch.setattr(os, "pwrite", short)
    path = tmp_path / "mark"
    guard = _guard(path, Counter(1))
    names = [f"run/{n:04d}-{'x' * 40}" for n in range(1_500)]
    for n, name in enumerate(names):
        guard.advance({name: n + 1})
    monkeypatch.setattr(os, "pwrite", real)
    assert max(calls) > 7, "the writes were really cut short"
    state = MarkFileStore(path).read()
    assert state is not None
    assert parse_mark(state.head, KEY, "").records < len(names), "a compaction ran"
    assert _sizes(path) == {name: n + 1 for n, name in enumerate(names)}
    assert path.stat().st_size == LOG_OFFSET + state.log_size


def test_threads_of_one_group_commit_all_reach_the_mark(tmp_path: Path) -> None:
    """Whichever thread writes takes every size left pending; none is dropped."""
    path = tmp_path / "mark"
    guard = _guard(path, Counter(1))
    start = threading.Barrier(8)

    def writer(n: int) -> None:
        start.wait()
        for size in range(1, 21):
            guard.advance({f"t{n}": size})

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert _sizes(path) == {f"t{n}": 20 for n in range(8)}
    assert _mark(path).records <= 8 * 20


def test_a_failed_write_keeps_its_sizes_for_the_next(tmp_path: Path) -> None:
    """A mark that cannot be written is deferred, never forgotten."""
    path = tmp_path / "mark"
    guard = _guard(path, Counter(1))
    guard.advance({"a": 1})
    path.chmod(0o644)
    with pytest.raises(InsecurePermissions):
        guard.advance({"b": 4})
    path.chmod(0o600)
    guard.advance()
    assert _sizes(path) == {"a": 1, "b": 4}


def test_a_forged_mark_is_refused_on_open(tmp_path: Path) -> None:
    """A mark written without the key (or edited) fails the check until accepted."""
    path = tmp_path / "mark"
    forged = format_mark(HighWaterMark(1_000), OTHER)
    MarkFileStore(path).update(lambda _: MarkWrite(forged, replace_log=True))
    with pytest.raises(IntegrityFailure, match="does not verify"):
        _guard(path, Counter(4)).check()
    assert _guard(path, Counter(4)).accept() == (None, 4)
    assert _guard(path, Counter(4)).check() == 4


def test_a_torn_slot_or_a_lost_append_keeps_the_previous_mark(tmp_path: Path) -> None:
    """Each update writes the other slot; a spoilt newest slot or append leaves the one before."""
    path = tmp_path / "mark"
    marks = MarkFileStore(path)
    marks.update(lambda _: MarkWrite(b"first", b"one\n"))
    marks.update(lambda _: MarkWrite(b"second", b"two\n"))

    def read() -> tuple[bytes, bytes]:
        state = marks.read()
        assert state is not None
        return state.head, state.log()

    assert read() == (b"second", b"one\ntwo\n")
    assert path.stat().st_size == LOG_OFFSET + 8
    with open(path, "r+b") as file:
        file.seek(LOG_OFFSET + 5)
        file.write(b"X")
    assert read() == (b"first", b"one\n"), "an append that never reached the disk is not trusted"
    marks.update(lambda current: MarkWrite((current.head if current else b"") + b"+third", b"3\n"))
    assert read() == (b"first+third", b"one\n3\n"), "written over the slot that did not hold"
    with open(path, "r+b") as file:
        file.write(b"\xff" * 40)
    assert read() == (b"first+third", b"one\n3\n"), "spoiling the older slot changes nothing"
    with open(path, "r+b") as file:
        file.seek(SLOT_BYTES + 40)
        file.write(b"\x00torn")
    assert read() == (b"", b""), "with no intact slot the mark reads as an unverifiable head"
    assert MarkFileStore(tmp_path / "absent").read() is None


def test_the_reader_reports_every_head_it_passed_over(tmp_path: Path) -> None:
    """What a fallback skipped is named: a torn append's head, or ``b""`` for a failing slot."""
    path = tmp_path / "mark"
    marks = MarkFileStore(path)
    marks.update(lambda _: MarkWrite(b"first", b"one\n"))

    def read() -> MarkState:
        state = marks.read()
        assert state is not None
        return state

    assert (read().head, read().passed_over) == (b"first", ()), "a blank second slot is unwritten"
    marks.update(lambda _: MarkWrite(b"second", b"two\n"))
    marks.update(lambda _: MarkWrite(b"third", b"three\n"))
    pristine = path.read_bytes()
    damaged = {
        "newest slot": (40, b"\x00torn", b"second", (b"",)),
        "older slot": (SLOT_BYTES + 40, b"\x00torn", b"third", (b"",)),
        "newest append": (LOG_OFFSET + 9, b"X", b"second", (b"third",)),
        "wiped newest slot": (0, bytes(SLOT_BYTES), b"second", (b"",)),
        "wiped older slot": (SLOT_BYTES, bytes(SLOT_BYTES), b"third", (b"",)),
    }
    for name, (offset, patch, head, passed) in damaged.items():
        path.write_bytes(pristine[:offset] + patch + pristine[offset + len(patch) :])
        assert (read().head, read().passed_over) == (head, passed), name
    path.write_bytes(pristine)
    assert read().passed_over == ()
    path.write_bytes(b"")
    assert (read().head, read().empty) == (b"", True), "an empty file is not a missing one"
    assert MarkFileStore(tmp_path / "absent").read() is None


def test_a_new_mark_is_linked_into_place_whole(tmp_path: Path) -> None:
    """No empty file is ever left at the path; a writer that loses the race updates the winner's."""
    path = tmp_path / "mark"
    calls: list[bytes | None] = []

    def change(current: MarkState | None) -> MarkWrite:
        calls.append(None if current is None else current.head)
        if current is None:
            MarkFileStore(path).update(lambda _: MarkWrite(b"other", b"o\n", replace_log=True))
            assert path.stat().st_size == LOG_OFFSET + 2
            return MarkWrite(b"mine", b"m\n", replace_log=True)
        return MarkWrite(current.head + b"+mine", b"m\n")

    MarkFileStore(path).update(change)
    assert calls == [None, b"other"]
    state = MarkFileStore(path).read()
    assert state is not None
    assert (state.head, state.log(), state.passed_over) == (b"other+mine", b"o\nm\n", ())
    assert sorted(os.listdir(tmp_path)) == ["mark"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def _append(store: HighWaterStore | MemoryStore, stream: str) -> None:
    """Commit one event to ``stream``."""
    head = store.ledger_head(stream)
    index = 0 if head is None else head.index + 1
    store.commit(UnitOfWork(appends=[make_event(stream, index, head)]))


def _spoil(path: Path, offset: int, patch: bytes) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:offset] + patch + data[offset + len(patch) :])


def _newest_slot(path: Path) -> int:
    """Return the index of the slot the last update wrote: the higher sequence number."""
    data = path.read_bytes()
    sequences = [struct.unpack_from(">Q", data, index * SLOT_BYTES + 4)[0] for index in (0, 1)]
    return sequences.index(max(sequences))


def _passed_over_events(logs: Sequence[Mapping[str, object]]) -> list[object]:
    return [entry for entry in logs if entry["event"] == "high_water_mark_torn_head_passed_over"]


def test_a_damaged_head_is_passed_over_only_for_a_store_past_the_one_before(
    tmp_path: Path,
) -> None:
    """A crash tearing a head leaves the store holding its commit; an older copy does not.

    The store is past the head before the damaged one when it holds a
    higher count, or an event that head does not count (two writers can
    flush sizes for one count). Otherwise the damage is what would hide the
    newest head from an older copy, and the mark is refused.
    """
    path = tmp_path / "mark"
    live = MemoryStore()
    guarded = _guarded(path, live)
    _append(guarded, "a")
    _append(guarded, "a")
    older, same_count = MemoryStore(), MemoryStore()
    _append(older, "a")
    _append(older, "a")
    _grow(same_count, "a", 2)
    _grow(same_count, "b", 1)
    _append(guarded, "a")
    assert (_mark(path).epoch, older.epoch(), same_count.epoch()) == (3, 2, 2)
    _spoil(path, _newest_slot(path) * SLOT_BYTES + 60, b"\x00torn")
    torn = path.read_bytes()
    with pytest.raises(IntegrityFailure, match="fails its check") as refused:
        _guard(path, older).check()
    assert refused.value.details["high_water"] == 2
    assert "flowvault accept-restore" in refused.value.message
    assert _guard(path, older).accept() == (2, 2), "the way out for a copy kept on purpose"
    assert _guard(path, older).check() == 2
    for store, sizes in ((live, {"a": 3}), (same_count, {"a": 2, "b": 1})):
        path.write_bytes(torn)
        with capture_logs() as logs:
            assert _guard(path, store).check() == 2
        assert len(_passed_over_events(logs)) == 1
        state = MarkFileStore(path).read()
        assert state is not None
        assert state.passed_over == (), "the mark is written afresh from the store"
        assert _sizes(path) == sizes


def test_a_head_whose_log_line_was_spoilt_still_names_its_count(tmp_path: Path) -> None:
    """A torn append leaves a head that verifies: the store must be at its count, not just past."""
    path = tmp_path / "mark"
    live = MemoryStore()
    guarded = _guarded(path, live)
    _append(guarded, "a")
    _append(guarded, "a")
    older = MemoryStore()
    _grow(older, "a", 2)
    _append(older, "b")
    _append(guarded, "a")
    assert (_mark(path).epoch, older.epoch()) == (3, 2)
    _spoil(path, path.stat().st_size - 3, b"X")
    torn = path.read_bytes()
    with pytest.raises(StoreRolledBack) as refused:
        _guard(path, older).check()
    assert refused.value.details == {"epoch": 2, "high_water": 3}, (
        "past the head before it (stream b is longer), but not at the spoilt head's count"
    )
    with capture_logs() as logs:
        assert _guard(path, live).check() == 2
    assert len(_passed_over_events(logs)) == 1
    assert _mark(path).epoch == 3
    path.write_bytes(torn)
    _spoil(path, (1 - _newest_slot(path)) * SLOT_BYTES + 60, b"\x00torn")
    state = MarkFileStore(path).read()
    assert state is not None
    assert (state.head, len(state.passed_over)) == (b"", 2), "no head is left to fall back to"
    with pytest.raises(IntegrityFailure, match="does not verify"):
        _guard(path, live).check()


def test_an_empty_mark_is_refused_beside_a_store_holding_commits(tmp_path: Path) -> None:
    """Emptying the file is not deleting it: refused until accepted, unless the store is new."""
    path = tmp_path / "mark"
    path.write_bytes(b"")
    path.chmod(0o600)
    with capture_logs() as logs:
        assert _guard(path, Counter(0)).check() == 0
    assert logs == []
    assert _mark(path).epoch == 0
    path.write_bytes(b"")
    with pytest.raises(IntegrityFailure, match="is empty but the store holds 5 commits") as refused:
        _guard(path, Counter(5)).check()
    assert "flowvault accept-restore" in refused.value.message
    assert refused.value.details == {"location": str(path), "epoch": 5}
    assert _guard(path, Counter(5)).accept() == (None, 5)
    assert _guard(path, Counter(5)).check() == 5


def test_an_update_waiting_on_a_compaction_lands_in_the_new_file(tmp_path: Path) -> None:
    """A writer that locked the file a compaction replaced opens the new one and writes there."""
    path = tmp_path / "mark"
    MarkFileStore(path).update(lambda _: MarkWrite(b"head", b"a\n"))
    inside, release = threading.Event(), threading.Event()

    def compact(_: MarkState | None) -> MarkWrite:
        inside.set()
        assert release.wait(10)
        return MarkWrite(b"compacted", b"all\n", replace_log=True)

    compactor = threading.Thread(target=MarkFileStore(path).update, args=(compact,))
    compactor.start()
    assert inside.wait(10)
    seen: list[bytes] = []

    def append(current: MarkState | None) -> MarkWrite:
        assert current is not None
        seen.append(current.head)
        return MarkWrite(current.head + b"+more", b"b\n")

    waiter = threading.Thread(target=MarkFileStore(path).update, args=(append,))
    waiter.start()
    release.set()
    compactor.join()
    waiter.join()
    assert seen == [b"compacted"]
    state = MarkFileStore(path).read()
    assert state is not None
    assert (state.head, state.log()) == (b"compacted+more", b"all\nb\n")


def test_an_exposed_or_symlinked_mark_is_refused(tmp_path: Path) -> None:
    """The mark gets the key file's protections: private, regular, never followed."""
    path = tmp_path / "mark"
    MarkFileStore(path).update(lambda _: MarkWrite(b"x"))
    os.chmod(path, 0o644)
    with pytest.raises(InsecurePermissions, match="chmod 600"):
        MarkFileStore(path).read()
    os.chmod(path, 0o600)
    link = tmp_path / "link"
    link.symlink_to(path)
    with pytest.raises(InsecurePermissions, match="symlink"):
        MarkFileStore(link).read()
    with pytest.raises(InsecurePermissions, match="symlink"):
        MarkFileStore(link).update(lambda _: MarkWrite(b"y"))
    state = MarkFileStore(path).read()
    assert state is not None
    assert state.head == b"x"


class RecordingGuard(AntiRollback):
    """The real guard, counting its writes and failing the first ``failures`` of them."""

    def __init__(self, path: Path, store: MemoryStore, failures: int = 0) -> None:
        super().__init__(store, MarkFileStore(path), KEY)
        self.writes = 0
        self.failures = failures
        self.wrote = threading.Event()

    def advance(
        self, sizes: Mapping[str, int] | None = None, dropped: Collection[str] = ()
    ) -> None:
        """Fail while ``failures`` last, else write; count each write and signal it."""
        if self.failures:
            self.failures -= 1
            raise StoreUnavailable("injected: the mark's disk is full")
        super().advance(sizes, dropped)
        self.writes += 1
        self.wrote.set()


def _lagged(path: Path, store: MemoryStore, guard: RecordingGuard) -> HighWaterStore:
    guard.check()
    return HighWaterStore(store, guard, MarkFlusher(guard, window=0.05))


def _commit_one(guarded: HighWaterStore, store: MemoryStore, stream: str) -> None:
    """Commit one event to ``stream`` through ``guarded``."""
    head = store.ledger_head(stream)
    guarded.commit(
        UnitOfWork(appends=[make_event(stream, 0 if head is None else head.index + 1, head)])
    )


def _flushers() -> int:
    return sum(thread.name == "flowvault-high-water" for thread in threading.enumerate())


def test_a_lagged_mark_is_written_off_the_commit_path_and_in_full_at_close(
    tmp_path: Path,
) -> None:
    """A burst of commits costs fewer mark writes than commits; ``close`` writes all of it."""
    store = MemoryStore()
    path = tmp_path / "mark"
    guard = RecordingGuard(path, store)
    guarded = _lagged(path, store, guard)
    _commit_one(guarded, store, "warm")
    assert guard.wrote.wait(5), "the first commit after a quiet spell is written at once"
    before = guard.writes
    for step in range(50):
        _commit_one(guarded, store, f"s{step % 5}")
    assert guard.wrote.wait(5)
    count = store.epoch()
    guarded.close()
    assert guard.writes - before < 50, "commits of one window share a mark write"
    assert _mark(path).epoch == count
    assert _sizes(path) == {"warm": 1} | {f"s{n}": 10 for n in range(5)}


def test_a_lagged_mark_that_cannot_be_written_is_logged_and_retried(tmp_path: Path) -> None:
    """A failed background write keeps what it would have written and tries again."""
    store = MemoryStore()
    path = tmp_path / "mark"
    guard = RecordingGuard(path, store)
    guarded = _lagged(path, store, guard)
    guard.failures = 2
    guard.wrote.clear()
    with capture_logs() as logs:
        _commit_one(guarded, store, "s")
        assert guard.wrote.wait(5)
    assert [entry["code"] for entry in logs if entry["event"] == "high_water_mark_deferred"] == [
        "STORE_UNAVAILABLE",
        "STORE_UNAVAILABLE",
    ]
    assert _sizes(path) == {"s": 1}
    guarded.close()


def test_closing_the_store_ends_the_flusher_thread(tmp_path: Path) -> None:
    """The thread starts with the first commit and ends with ``close``; none leaks."""
    store = MemoryStore()
    path = tmp_path / "mark"
    before = _flushers()
    guarded = _lagged(path, store, RecordingGuard(path, store))
    assert _flushers() == before
    _commit_one(guarded, store, "s")
    assert _flushers() == before + 1
    guarded.close()
    assert _flushers() == before


def test_an_interpreter_exiting_without_close_writes_the_pending_mark(tmp_path: Path) -> None:
    """A host that never closes the store still leaves the mark caught up when it exits."""
    script = f"""
from pathlib import Path
from flowvault.composition import Settings, bootstrap
from flowvault.domain import WorkflowState
settings = Settings(home=Path({str(tmp_path)!r}) / "home")
runtime = bootstrap(settings, key=bytes(range(32)), create=True)
for step in range(30):
    runtime.state("main").save(WorkflowState(step=step))
print(runtime.store.epoch())
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    state = MarkFileStore(tmp_path / "home" / "keys" / "store.high-water").read()
    assert state is not None
    assert parse_mark(state.head, KEY, "").epoch == int(done.stdout)


def test_a_postgres_mark_is_named_by_the_server_libpq_reaches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Spellings of one server share a mark; servers chosen by the environment do not."""
    pytest.importorskip("psycopg", reason="the postgres extra is not installed")
    for variable in ("PGHOST", "PGPORT", "PGDATABASE", "PGUSER"):
        monkeypatch.delenv(variable, raising=False)
    one = postgres_mark_name("postgresql://app:secret@db/vault", "flowvault")
    for spelling in (
        "postgresql://other@DB:5432/vault",
        "host=db dbname=vault",
        "postgresql:///vault?host=db&sslmode=require",
    ):
        assert postgres_mark_name(spelling, "flowvault") == one, spelling
    assert "secret" not in one
    assert postgres_mark_name("postgresql://db/vault", "other") != one
    assert postgres_mark_name("postgresql://db:5433/vault", "flowvault") != one
    monkeypatch.setenv("PGHOST", "db")
    assert postgres_mark_name("dbname=vault", "flowvault") == one
    monkeypatch.setenv("PGHOST", "replica-restore")
    assert postgres_mark_name("dbname=vault", "flowvault") != one
