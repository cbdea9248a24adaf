"""Whole-store anti-rollback: a MAC'd high-water mark of the commit count and stream sizes.

Every row and chain of an older copy of the database is genuine, so nothing
inside the store can show that the copy was put back over the live one, or
that someone able to edit the database deleted a stream's newest events and
set its commit count high again. The mark, kept outside the database
(beside the keys), remembers the highest commit count this host has seen
and the size of every ledger stream it has seen written. A store opened
below either is refused with ``STORE_ROLLED_BACK``.

The sizes live in an append-only log beside the mark's head
(``_mark_format``): each flush appends one line naming the streams its
commits grew or dropped. The log is compacted into one line of every
stream's size once it has grown to twice its size after the last
compaction, or once the streams it forgot outweigh those it remembers.
A stream gone from the store, or shorter than the mark remembers, is
accepted on open only when a keyed ``ledger.dropped`` event proves a key
holder dropped it at or past the size remembered (``_stream_drops``); it
is then forgotten. The mark is
advanced after commits, never before the database holds what it names:
at once in the strict mode, a bounded window behind in the default one
(``_mark_flusher``).

A crash can tear the newest head, and the file then falls back to the one
before. Damage looks the same and would hide the newest head from an older
copy, so the fallback is taken only when the store is past the head it
falls back to, as it is after a crash: the mark is written after its commit.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Final, Protocol, runtime_checkable

from flowvault.application._capabilities import HeadReader, StoreCapabilities
from flowvault.application._keyed_digester import KeyedDigester
from flowvault.application._mark_format import (
    LOG_GENESIS,
    HighWaterMark,
    MarkFile,
    MarkState,
    MarkWrite,
    apply_line,
    format_mark,
    log_line,
    log_link,
    parse_mark,
    replay_log,
)
from flowvault.application._observability import EventLog
from flowvault.application._stream_drops import LedgerReader, proven_drops
from flowvault.application.ports import MAX_HEAD_BATCH, StoreEpoch
from flowvault.domain import (
    IntegrityFailure,
    InvalidInput,
    LedgerEvent,
    StoreRolledBack,
)

COMPACT_SLACK: Final = 64 * 1024
"""Log bytes allowed beyond twice the last compaction's size before compacting again."""

_log = EventLog("flowvault.high_water")


@runtime_checkable
class MarkedStore(StoreEpoch, Protocol):
    """A store the mark can guard: its commit count and its streams' heads.

    The mark takes any store and finds the count through ``StoreCapabilities``;
    this names the shape for hosts that type a store by it.
    """

    def ledger_head(self, stream: str) -> LedgerEvent | None:
        """Return the last event of ``stream``, or ``None`` when it is empty."""
        ...


def _batches(names: Sequence[str]) -> Iterator[Sequence[str]]:
    for start in range(0, len(names), MAX_HEAD_BATCH):
        yield names[start : start + MAX_HEAD_BATCH]


class AntiRollback:
    """Checks a store against its high-water mark on open, and advances the mark after commits.

    ``capabilities`` are ``store``'s, when the caller has looked them up
    already; the mark reads the commit count, stream heads and names
    through them.

    Raises:
        InvalidInput: the store keeps no commit count (no ``StoreEpoch``).

    """

    def __init__(
        self,
        store: HeadReader,
        marks: MarkFile,
        digester: KeyedDigester,
        *,
        capabilities: StoreCapabilities | None = None,
    ) -> None:
        self._store = store
        found = StoreCapabilities.of(store) if capabilities is None else capabilities
        if found.epoch is None:
            raise InvalidInput("this store keeps no commit count (no StoreEpoch)")
        self._epoch = found.epoch
        self._capabilities = found
        self._catalog = found.catalog
        self._marks = marks
        self._digester = digester
        self._written = -1
        self._lock = threading.Lock()
        self._pending_lock = threading.Lock()
        self._pending: dict[str, int] = {}
        """What the next write appends, as one log line reads (``apply_line``)."""
        self._asked = 0
        self._flushed = 0
        self._forgotten = 0
        """Bytes of drop entries this process wrote since it last compacted the log."""
        self._compact_next = False

    @property
    def location(self) -> str:
        """Where the mark is kept."""
        return self._marks.location

    def check(self) -> int:
        """Refuse a store below the mark, then record where it is; return the epoch found.

        A missing mark is started from the store as it is: there is nothing
        to compare with yet, as on a store's first open under this feature.
        It is logged as a warning unless the store is new, since deleting
        the mark is also how someone would hide a restore. An empty mark
        file beside a store holding commits is refused instead: no update
        leaves one (a new mark is linked into place whole), so it was
        emptied.

        Raises:
            StoreRolledBack: the store's count, or a stream's size, is below the mark.
            IntegrityFailure: the mark or its log does not verify under the key, the
                file is empty, or a head was passed over that the store is not past.

        """
        state = self._marks.read()
        current = self._epoch.epoch()
        if state is None or (state.empty and not current):
            if current:
                _log.warning("high_water_mark_started", location=self.location, epoch=current)
            self._restart(current)
            return 0
        mark, excused, sizes = self._compared(state, current)
        if excused:
            _log.warning(
                "high_water_mark_drops_accepted", location=self.location, streams=len(excused)
            )
            self.note({name: size for name, size in excused.items() if size}, dropped=excused)
        if state.passed_over or mark.records == 0:
            self._restart(current)
        else:
            self._compact_next = state.log_size > 2 * len(log_line(sizes)) + COMPACT_SLACK
            self.advance()
        return mark.epoch

    def inspect(self) -> int | None:
        """Compare the store with the mark, writing nothing; return the mark's epoch.

        Returns ``None`` when there is no mark to compare with (none kept
        yet, or an empty file beside an empty store). ``doctor`` reports
        with this what opening the store would refuse.

        Raises:
            StoreRolledBack / IntegrityFailure: as ``check``.

        """
        state = self._marks.read()
        current = self._epoch.epoch()
        if state is None or (state.empty and not current):
            return None
        return self._compared(state, current)[0].epoch

    def _compared(
        self, state: MarkState, current: int
    ) -> tuple[HighWaterMark, dict[str, int], dict[str, int]]:
        """Verify the mark and refuse a store below it.

        Returns the mark, the streams found short whose drop is proven
        (with their size in the store now, 0 when gone) and the sizes the
        mark remembers.
        """
        if state.empty:
            raise IntegrityFailure(
                f"the high-water mark at {self.location} is empty but the store holds "
                f"{current} commits: the mark was emptied, which would hide an older copy of "
                "the database; put the newest copy back, or, if this copy is the one to keep, "
                "run `flowvault accept-restore` to start the mark afresh from it",
                location=self.location,
                epoch=current,
            )
        mark = parse_mark(state.head, self._digester, self.location)
        sizes = replay_log(mark, state.log(), self._digester, self.location)
        if current < mark.epoch:
            raise self._rolled_back(current, mark.epoch)
        excused = self._compare(sizes)
        if state.passed_over:
            self._check_passed_over(state.passed_over, mark, sizes, current)
        return mark, excused, sizes

    def _rolled_back(self, current: int, seen: int) -> StoreRolledBack:
        return StoreRolledBack(
            f"the store is at commit {current} but this host already saw it at commit "
            f"{seen} (high-water mark {self.location}): an older copy of the "
            "database was restored over it, and the commits since that copy are gone",
            epoch=current,
            high_water=seen,
        )

    def _check_passed_over(
        self,
        heads: Sequence[bytes],
        mark: HighWaterMark,
        sizes: Mapping[str, int],
        current: int,
    ) -> None:
        """Refuse unless the store is where a crash tearing the passed-over heads leaves it.

        A head is written after the commits it counts, so a torn one leaves
        the store holding them. One whose log line alone was spoilt still
        verifies: the store must be at its count. One that does not verify
        names nothing: the store must hold something ``mark`` does not, a
        higher count or a longer stream, or the damage is what hid a newer
        head from an older copy of the database.
        """
        unknown = False
        for head in heads:
            newer = self._successor(head, mark)
            if newer is None:
                unknown = True
            elif current < newer.epoch:
                raise self._rolled_back(current, newer.epoch)
        if unknown and not self._ahead(mark, sizes, current):
            raise IntegrityFailure(
                f"a head of the high-water mark at {self.location} fails its check, and the "
                f"store (commit {current}) holds nothing the intact head before it (commit "
                f"{mark.epoch}) does not count, as it would had a crash torn a newer head: the "
                "mark was damaged, or an older copy of the database was put back; put the "
                "newest copy back, or, if this copy is the one to keep, run "
                "`flowvault accept-restore`",
                location=self.location,
                epoch=current,
                high_water=mark.epoch,
            )
        _log.warning(
            "high_water_mark_torn_head_passed_over",
            location=self.location,
            epoch=current,
            high_water=mark.epoch,
        )

    def _successor(self, head: bytes, mark: HighWaterMark) -> HighWaterMark | None:
        """Return ``head`` if it verifies and is the one ``mark``'s next update wrote."""
        try:
            newer = parse_mark(head, self._digester, self.location)
        except IntegrityFailure:
            return None
        follows = newer.records == mark.records + 1 and newer.base == mark.base
        return newer if follows and newer.epoch >= mark.epoch else None

    def _ahead(self, mark: HighWaterMark, sizes: Mapping[str, int], current: int) -> bool:
        """Whether the store holds a commit, or an event, that ``mark`` does not count."""
        if current > mark.epoch:
            return True
        return any(size > sizes.get(name, 0) for name, size in self._sizes_in_store().items())

    def _compare(self, sizes: Mapping[str, int]) -> dict[str, int]:
        """Refuse a stream shorter than remembered unless proven dropped; return those proven."""
        short: list[tuple[str, int, int]] = []
        for names in _batches(sorted(sizes)):
            heads = self._head_indexes(names)
            short += [
                (name, heads.get(name, -1) + 1, sizes[name])
                for name in names
                if heads.get(name, -1) + 1 < sizes[name]
            ]
        proven = self._proven_drops() if short else {}
        excused = {
            name: size for name, size, seen in short if proven.get(name, -1) >= seen - 1
        }
        short = [entry for entry in short if entry[0] not in excused]
        if short:
            stream, size, seen = short[0]
            others = f" (and {len(short) - 1} more streams)" if len(short) > 1 else ""
            raise StoreRolledBack(
                f"ledger stream {stream} holds {size} events but this host already saw "
                f"{seen}{others} (high-water mark {self.location}): its newest events were "
                "deleted, or an older copy of the database was restored over it",
                stream=stream,
                size=size,
                high_water=seen,
                streams=len(short),
            )
        return excused

    def _proven_drops(self) -> Mapping[str, int]:
        """Return the streams the registry proves dropped; none if the store reads no ledger."""
        if not isinstance(self._store, LedgerReader):
            return {}
        return proven_drops(self._store, self._digester)

    def _head_indexes(self, names: Sequence[str]) -> Mapping[str, int]:
        return self._capabilities.head_indexes(self._store, names)

    def _sizes_in_store(self) -> dict[str, int]:
        """Every stream's size as the store holds it now; none if it cannot list them."""
        if self._catalog is None:
            return {}
        sizes: dict[str, int] = {}
        after: str | None = None
        while names := self._catalog.list_streams(after=after, limit=MAX_HEAD_BATCH):
            sizes.update((name, index + 1) for name, index in self._head_indexes(names).items())
            after = names[-1]
        return sizes

    def _restart(self, current: int, *, force: bool = False) -> None:
        """Write the mark from the store as it is now: its count and every stream's size.

        Unless ``force``d, a readable mark found meanwhile (another process
        opening the same store) is merged in rather than lowered.
        """
        sizes = self._sizes_in_store()

        def restarted(state: MarkState | None) -> MarkWrite:
            mark = None if force else self._readable(state)
            if mark is None or state is None:
                return self._fresh(current, sizes)
            return self._compacted(mark, state, max(mark.epoch, current), sizes)

        with self._lock:
            self._marks.update(restarted)
            self._written = max(self._written, current)

    def _fresh(self, epoch: int, entry: Mapping[str, int]) -> MarkWrite:
        sizes: dict[str, int] = {}
        apply_line(sizes, entry)
        if not sizes:
            return MarkWrite(format_mark(HighWaterMark(epoch), self._digester), replace_log=True)
        line = log_line(sizes)
        chain = log_link(self._digester, LOG_GENESIS, line[:-1])
        mark = HighWaterMark(epoch, 1, chain, len(line))
        return MarkWrite(format_mark(mark, self._digester), line, replace_log=True)

    def note(self, sizes: Mapping[str, int], dropped: Collection[str] = ()) -> None:
        """Remember what a commit did, for the next ``advance`` to write.

        ``dropped`` are the streams it dropped (forgotten first), ``sizes``
        the sizes the streams it appended to reached.
        """
        with self._pending_lock:
            _merge(self._pending, _entry(sizes, dropped))

    def advance(
        self, sizes: Mapping[str, int] | None = None, dropped: Collection[str] = ()
    ) -> None:
        """Raise the mark to the store's count and to ``sizes``; forget ``dropped`` streams.

        The count and a stream's size are never lowered; a dropped stream
        is forgotten, and its size counts afresh from its next event.

        The file is shared by every process of this host, so the new mark
        is the higher of the one found and what this process saw. Threads
        take turns: the one that writes takes every size the others left
        pending, so the units of one group commit write the mark once.
        """
        with self._pending_lock:
            _merge(self._pending, _entry(sizes or {}, dropped))
            self._asked += 1
            ticket = self._asked
        with self._lock:
            if self._flushed >= ticket:
                return
            with self._pending_lock:
                batch, self._pending = self._pending, {}
                asked = self._asked
            try:
                self._write(batch, self._epoch.epoch())
            except BaseException:
                with self._pending_lock:
                    _merge(batch, self._pending)
                    self._pending = batch
                raise
            self._flushed = asked

    def _write(self, batch: Mapping[str, int], current: int) -> None:
        compact, self._compact_next = self._compact_next, False
        if not batch and current <= self._written and not compact:
            return
        forgets = sum(len(log_line({name: size})) for name, size in batch.items() if size <= 0)

        def raised(state: MarkState | None) -> MarkWrite | None:
            mark = self._readable(state)
            if mark is None or state is None:
                self._forgotten = 0
                return self._fresh(current, batch)
            epoch = max(mark.epoch, current)
            if not batch and not compact:
                if mark.epoch >= current:
                    return None
                return MarkWrite(format_mark(replace(mark, epoch=epoch), self._digester))
            if compact or self._outgrown(mark, state, forgets):
                self._forgotten = 0
                return self._compacted(mark, state, epoch, batch)
            self._forgotten += forgets
            line = log_line(batch)
            chain = log_link(self._digester, mark.chain, line[:-1])
            grown = HighWaterMark(epoch, mark.records + 1, chain, mark.base)
            return MarkWrite(format_mark(grown, self._digester), line)

        self._marks.update(raised)
        self._written = max(self._written, current)

    def _outgrown(self, mark: HighWaterMark, state: MarkState, forgets: int) -> bool:
        """Whether the log is due for compaction before ``forgets`` more bytes of drops.

        It is past twice its compacted size; or it would be mostly dead:
        each drop entry cancels an entry about as long written before, so
        the drops this process wrote since it last compacted, counted
        twice, outweigh half the log (plus the slack).
        """
        if mark.records == 0 or state.log_size > 2 * mark.base + COMPACT_SLACK:
            return True
        dropped = self._forgotten + forgets
        return bool(forgets) and 4 * dropped > state.log_size + COMPACT_SLACK

    def _readable(self, state: MarkState | None) -> HighWaterMark | None:
        if state is None:
            return None
        try:
            return parse_mark(state.head, self._digester, self.location)
        except IntegrityFailure:
            _log.warning("high_water_mark_replaced", location=self.location)
            return None

    def _compacted(
        self, mark: HighWaterMark, state: MarkState, epoch: int, batch: Mapping[str, int]
    ) -> MarkWrite:
        try:
            sizes = replay_log(mark, state.log(), self._digester, self.location)
        except IntegrityFailure:
            _log.warning("high_water_mark_replaced", location=self.location)
            sizes = {}
        apply_line(sizes, batch)
        return self._fresh(epoch, sizes)

    def accept(self) -> tuple[int | None, int]:
        """Accept the store as it is after a deliberate restore: restart the mark from it.

        Returns the epoch the mark held (``None`` if none or unreadable) and the new one.
        """
        found = self._readable(self._marks.read())
        previous = None if found is None else found.epoch
        current = self._epoch.epoch()
        self._restart(current, force=True)
        _log.warning(
            "high_water_mark_accepted", location=self.location, previous=previous, epoch=current
        )
        return previous, current


def _entry(sizes: Mapping[str, int], dropped: Collection[str]) -> dict[str, int]:
    """One commit's writes as a log line reads them: drops forgotten first, then sizes."""
    entry = dict.fromkeys(dropped, 0)
    _merge(entry, sizes)
    return entry


def _merge(pending: dict[str, int], later: Mapping[str, int]) -> None:
    """Fold ``later`` (entries of a log line, ``apply_line``) into ``pending``, written before it.

    The result reads, as one line, as the two lines one after the other: a
    drop in ``later`` forgets what ``pending`` said; a size after a drop
    stays a size after a drop (negative); sizes keep the higher.
    """
    for stream, size in later.items():
        before = pending.get(stream)
        if size <= 0 or before is None:
            pending[stream] = size
        elif before <= 0:
            pending[stream] = -max(-before, size)
        else:
            pending[stream] = max(before, size)


__all__ = ["COMPACT_SLACK", "AntiRollback", "MarkedStore"]
