"""S8: flowvault's LangGraph checkpointer beside LangGraph's own encrypted SQLite saver.

Both savers keep a SQLite file in WAL mode with ``synchronous=FULL`` on the
same disk and store the same checkpoint (one channel holding a workflow
document). ``S8-pairs`` is what a running graph does per step: ``put`` a
checkpoint, then ``get_tuple`` the thread's newest. ``S8-latest`` reads the
newest checkpoint of a thread holding many (1,000 at full size), which is
what resuming a long-running thread costs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from _harness import Recorder, Row, Sample, ScenarioResult, interleave_rounds
from _peer import CHANNEL, PEER_NAME, PeerSaver
from _scenarios import RAW_READ, RAW_WRITE, Context, PeerSlot, _peer_figures, open_peer
from _workload import Orders, workflow_document

LONG_THREAD_FULL: Final = 1000
LONG_THREAD_QUICK: Final = 100


class FlowvaultThreads:
    """``FlowvaultSaver`` behind the peer's small surface: ``put`` a document, read the newest."""

    def __init__(self, path: Path, key: bytes) -> None:
        from langgraph.checkpoint.base import (  # noqa: PLC0415 - the langgraph extra
            create_checkpoint,
            empty_checkpoint,
        )

        from flowvault.adapters.langgraph import FlowvaultSaver  # noqa: PLC0415

        self._create = create_checkpoint
        self._empty = empty_checkpoint
        self._opened = FlowvaultSaver.from_conn_string(str(path), key=key)
        self._saver = self._opened.__enter__()

    def put(
        self, thread_id: str, document: Mapping[str, object], step: int, parent: str | None
    ) -> str:
        """Write ``document`` as the thread's checkpoint after ``parent``; return its id."""
        checkpoint = self._create(self._empty(), None, step)
        checkpoint["channel_values"] = {CHANNEL: dict(document)}
        checkpoint["channel_versions"] = {CHANNEL: step + 1}
        configurable: dict[str, str] = {"thread_id": thread_id, "checkpoint_ns": ""}
        if parent is not None:
            configurable["checkpoint_id"] = parent
        saved = self._saver.put(
            {"configurable": configurable},
            checkpoint,
            {"source": "loop", "step": step, "parents": {}},
            {CHANNEL: step + 1},
        )
        return str(saved["configurable"]["checkpoint_id"])

    def latest(self, thread_id: str) -> Mapping[str, object] | None:
        """Return the document of the thread's newest checkpoint, or ``None``."""
        found = self._saver.get_tuple(
            {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        )
        if found is None:
            return None
        document = found.checkpoint["channel_values"].get(CHANNEL)
        return document if isinstance(document, dict) else None

    def close(self) -> None:
        """Close the store."""
        self._opened.__exit__(None, None, None)


Saver = FlowvaultThreads | PeerSaver


def _document(thread_id: str, step: int) -> dict[str, object]:
    order = Orders(thread_id).take(1)[0]
    return workflow_document(thread_id, order, "intake", step + 1, datetime.now(UTC).isoformat())


def _pairs(saver: Saver, thread_id: str, pairs: int) -> Sample:
    """``put`` then ``get_tuple`` of the newest, ``pairs`` times on one new thread."""
    recorder = Recorder()
    parent: str | None = None
    for step in range(pairs):
        started = time.perf_counter()
        parent = saver.put(thread_id, _document(thread_id, step), step, parent)
        found = saver.latest(thread_id)
        if found is None or found.get("workflow_id") != thread_id:
            recorder.errors += 1
            continue
        recorder.record(started)
    return recorder.sample()


def _latest(saver: Saver, thread_id: str, reads: int) -> Sample:
    recorder = Recorder()
    for _ in range(reads):
        started = time.perf_counter()
        found = saver.latest(thread_id)
        if found is None or found.get("workflow_id") != thread_id:
            recorder.errors += 1
            continue
        recorder.record(started)
    return recorder.sample()


def _fill(saver: Saver, thread_id: str, length: int) -> None:
    parent: str | None = None
    for step in range(length):
        parent = saver.put(thread_id, _document(thread_id, step), step, parent)


@contextmanager
def _flowvault(ctx: Context, name: str) -> Iterator[FlowvaultThreads]:
    saver = FlowvaultThreads(ctx.work / f"{name}-flowvault.db", ctx.peer_key)
    try:
        yield saver
    finally:
        saver.close()


def _peer_saver(peer: PeerSlot) -> PeerSaver | None:
    return peer if isinstance(peer, PeerSaver) else None


def s8_langgraph(ctx: Context) -> ScenarioResult:
    """S8: the LangGraph checkpointer: put + newest pairs, and the newest of a long thread."""
    quick = ctx.sizes.repetitions <= 5 and ctx.sizes.s2_reads <= 100
    pairs = 20 if quick else 200
    reads = 50 if quick else 1000
    length = LONG_THREAD_QUICK if quick else LONG_THREAD_FULL
    raw = ctx.raw_sqlite("s8")
    counter = iter(range(1_000_000))
    try:
        with _flowvault(ctx, "s8") as ours, open_peer(ctx, "s8") as peer:
            theirs = _peer_saver(peer)
            rounds = interleave_rounds(
                ctx.sizes.repetitions,
                lambda: raw.write_sample(pairs),
                lambda: _pairs(ours, f"{ctx.tag}-s8-{next(counter)}", pairs),
                peer=None
                if theirs is None
                else (lambda: _pairs(theirs, f"{ctx.tag}-s8-peer-{next(counter)}", pairs)),
            )
            pair_row = Row(
                "S8-pairs",
                "LangGraph put + get_tuple(newest)",
                rounds.scenario,
                RAW_WRITE,
                rounds.baseline,
                f"one op = a put and a read of the newest, on a new thread of {pairs} steps",
                unit="pair",
                peer=_peer_figures(peer, rounds.peer),
            )
            long_thread = f"{ctx.tag}-s8-long"
            _fill(ours, long_thread, length)
            if theirs is not None:
                _fill(theirs, long_thread, length)
            lookups = interleave_rounds(
                ctx.sizes.repetitions,
                lambda: raw.read_sample(reads),
                lambda: _latest(ours, long_thread, reads),
                peer=None if theirs is None else (lambda: _latest(theirs, long_thread, reads)),
            )
            latest_row = Row(
                "S8-latest",
                f"LangGraph get_tuple(newest), thread of {length:,}",
                lookups.scenario,
                RAW_READ,
                lookups.baseline,
                f"the newest checkpoint of one thread holding {length:,}",
                peer=_peer_figures(peer, lookups.peer),
            )
    finally:
        raw.close()
    return ScenarioResult(
        "S8", "LangGraph checkpointer", [pair_row, latest_row], {"peer": PEER_NAME}
    )
