"""SIGKILL at random moments: no acknowledged write is lost, no unit half-applied, no retry doubled.

Two harnesses over a real SQLite file (``synchronous=full``) and real
writer processes killed with SIGKILL. Writers are forked by one long-lived
fork server (``crash_worker.py``), so a kill cycle costs a fork and a store
open, not an interpreter start. After every kill the test reopens the store
through ``bootstrap`` and checks it before the next writer continues.

- The crash loop: a writer continues the same workflows, state scopes and
  run (transitions with their ledger events, state updates, action results,
  approval requests and decisions) and reports each write only after the
  call returned; it is killed 0-50 ms after an acknowledgement. Its
  negative control acknowledges before it writes, and the same checker must
  find acknowledged writes missing.
- The commit/ack window: a writer makes one idempotent call and is killed
  around the commit, often after it and before the acknowledgement; the
  next writer, a restarted host, first retries that call with the same key,
  and the test requires the original result and no second effect. Its
  negative control retries with a fresh key, and the same duplicate counter
  must see the second effect.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import random
import select
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import reliability
from mark_lag import mark_trailed

from flowvault.adapters.system import MarkFileStore
from flowvault.application import LabelFilter, LedgerAudit, Order, UnitOfWork
from flowvault.application._audit import RecordReadability, list_all_streams
from flowvault.application._freshness import (
    ACTION_RESULT_KIND,
    CHECKPOINT_KIND,
    DEFINITION_KIND,
    IDEMPOTENCY_KIND,
    RESULT_KIND,
    WITNESS_KIND,
)
from flowvault.application._record_kinds import APPROVAL_SLOTS, APPROVALS, CHECKPOINTS
from flowvault.application._state import history_stream
from flowvault.application._streams import run_stream
from flowvault.application._workflow_records import stream_of
from flowvault.composition import Runtime, Settings, bootstrap
from flowvault.domain import (
    CheckpointStatus,
    FlowvaultError,
    IntegrityFailure,
    LedgerEvent,
    WorkOrder,
)
from flowvault.domain._approvals import checkpoint_id_for
from flowvault.domain._ledger import GENESIS_HASH, verify_chain

RECORD_STREAM_KINDS = frozenset(
    {
        ACTION_RESULT_KIND,
        CHECKPOINT_KIND,
        DEFINITION_KIND,
        IDEMPOTENCY_KIND,
        RESULT_KIND,
        WITNESS_KIND,
    }
)
"""Streams named by a record's keyed digest; their chains are continued like any other."""

WORKER_PATH = Path(__file__).with_name("crash_worker.py")
MASTER_KEY = bytes(range(32))
ACK_TIMEOUT = 30.0
"""Seconds a writer may take to acknowledge anything before the test gives up on it."""
LANES = 4
"""Writer threads in a threaded cycle, and workflows and scopes in the loop's world."""
KILL_WINDOW = 0.05
"""The crash loop kills 0-50 ms after the acknowledgement it waited for."""
MAX_ACKS_BEFORE_KILL = 4
CONTROL_LIMIT = 40
"""Cycles a negative control may take to be caught; it is caught within a few."""
WATERMARK_SLACK = timedelta(milliseconds=20)
"""Records written this long before a check began are reopened by the next check too."""
LISTING_PAGE = 4
"""Small pages: a check reads only the few newest records of each namespace."""


def _load_worker() -> ModuleType:
    """Import the worker module by path: the test shares its states, counts and calls."""
    spec = importlib.util.spec_from_file_location("crash_worker", WORKER_PATH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


worker = _load_worker()


# -- the fork server ------------------------------------------------------------


class AckPipe:
    """The read end of the pipe every child writes its acknowledgements to."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._partial = b""
        self._lines: deque[dict[str, Any]] = deque()

    def next(self, timeout: float) -> dict[str, Any] | None:
        """Return the next acknowledgement, or ``None`` if none arrives within ``timeout``."""
        deadline = time.monotonic() + timeout
        while not self._lines:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([self._fd], [], [], remaining)
            if ready:
                self._fill()
        return self._lines.popleft()

    def drain(self) -> list[dict[str, Any]]:
        """Return everything already in the pipe; call after the writer was reaped."""
        while select.select([self._fd], [], [], 0)[0]:
            self._fill()
        assert not self._partial, f"a torn acknowledgement line: {self._partial!r}"
        drained = list(self._lines)
        self._lines.clear()
        return drained

    def _fill(self) -> None:
        chunk = os.read(self._fd, 1 << 16)
        assert chunk, "the acknowledgement pipe closed"
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        self._lines.extend(json.loads(line) for line in lines)

    def close(self) -> None:
        """Close the read end."""
        os.close(self._fd)


class ForkServer:
    """Client of ``crash_worker.py``: fork a writer per cycle, SIGKILL it, reap it."""

    def __init__(self, log: Path) -> None:
        read_end, write_end = os.pipe()
        self._log = log
        with log.open("wb") as errors:
            self._process = subprocess.Popen(
                [sys.executable, str(WORKER_PATH), str(write_end)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
                pass_fds=(write_end,),
            )
        os.close(write_end)
        self.acks = AckPipe(read_end)
        self._living: set[int] = set()
        assert "ready" in self._ask(None), self.log_tail()

    def _ask(self, request: dict[str, Any] | None) -> dict[str, Any]:
        stdin, stdout = self._process.stdin, self._process.stdout
        assert stdin is not None
        assert stdout is not None
        if request is not None:
            stdin.write(json.dumps(request) + "\n")
            stdin.flush()
        line = stdout.readline()
        assert line, f"the fork server ended: {self.log_tail()}"
        answer: dict[str, Any] = json.loads(line)
        return answer

    def fork(self, task: dict[str, Any]) -> int:
        """Start a writer for ``task``; return its pid."""
        pid = int(self._ask({"op": "fork", "task": task})["pid"])
        self._living.add(pid)
        return pid

    def kill(self, pid: int) -> dict[str, Any]:
        """SIGKILL the writer and reap it; return how it ended.

        The pid cannot have been reused: the server reaps it only after this kill.
        """
        os.kill(pid, signal.SIGKILL)
        ended = self._ask({"op": "reap", "pid": pid})
        self._living.discard(pid)
        return ended

    def log_tail(self) -> str:
        """Return the end of the server's and children's stderr, for failure messages."""
        return self._log.read_text(errors="replace")[-2000:]

    def close(self) -> None:
        """Kill any writer left, stop the server and close the pipe."""
        for pid in list(self._living):
            self.kill(pid)
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=30)
        finally:
            if self._process.poll() is None:
                self._process.kill()
                self._process.wait()
            if self._process.stdout is not None:
                self._process.stdout.close()
            self.acks.close()


@contextmanager
def fork_server(tmp_path: Path, name: str) -> Iterator[ForkServer]:
    """Run a fork server for one harness, always stopped afterwards."""
    server = ForkServer(tmp_path / f"{name}.stderr")
    try:
        yield server
    finally:
        server.close()


def open_runtime(home: Path) -> Runtime:
    """Reopen the store the way a restarted host does: bootstrap over the same home and key."""
    return bootstrap(Settings(home=home, synchronous="full"), key=MASTER_KEY, create=True)


def mark_of(home: Path) -> MarkFileStore:
    """Return the high-water mark a host with ``home`` keeps."""
    path = Settings(home=home).high_water_path
    assert path is not None
    return MarkFileStore(path)


def base_task(home: Path, cycle: int) -> dict[str, Any]:
    """Return what every writer needs to open the store."""
    return {
        "home": str(home),
        "master": base64.urlsafe_b64encode(MASTER_KEY).decode(),
        "cycle": cycle,
    }


def integrity_problems(database: Path) -> list[str]:
    """Run ``PRAGMA integrity_check`` on its own connection; ``[]`` when it says ok."""
    connection = sqlite3.connect(database)
    try:
        rows = connection.execute("PRAGMA integrity_check").fetchall()
    finally:
        connection.close()
    return [] if rows == [("ok",)] else [f"integrity_check: {rows[:5]}"]


def raise_on_error(acks: list[dict[str, Any]], where: str) -> None:
    """Fail the test with the writer's traceback if it reported one."""
    for ack in acks:
        assert ack["k"] != "error", f"{where}: the writer failed:\n{ack['trace']}"


def check_killed(ended: dict[str, Any], where: str, server: ForkServer) -> None:
    """Require that the writer died of our SIGKILL, not of its own accord."""
    assert ended["signal"] == signal.SIGKILL, f"{where}: writer ended {ended}: {server.log_tail()}"


# -- the crash loop -------------------------------------------------------------


@dataclass(frozen=True)
class LoopWorld:
    """A store and the workflows, scopes and run its writers continue."""

    home: Path
    workflows: tuple[str, ...]
    scopes: tuple[str, ...]
    run: str

    @classmethod
    def create(cls, home: Path) -> LoopWorld:
        """Set up a workflow and a scope per lane, and a running graph run, in a new store."""
        with open_runtime(home) as runtime:
            workflows = tuple(
                runtime.workflows.create(
                    WorkOrder(
                        kind="crash.loop",
                        parameters={"lane": n},
                        requester="host@example.org",
                        idempotency_key=f"crash-loop-{n}",
                    )
                )[0].workflow_id
                for n in range(LANES)
            )
            runtime.definitions.register_definition("crash.loop", {"nodes": ["work", "approve"]})
            run, _ = runtime.runs.start_run("crash.loop", {"loop": True})
            runtime.runs.set_status(run.run_id, "running", expected_status="accepted")
        scopes = tuple(f"crash-{n}" for n in range(LANES))
        return cls(home, workflows, scopes, run.run_id)

    def task(
        self, cycle: int, seed: int, *, early: bool, hint: int, threads: int = 1
    ) -> dict[str, Any]:
        """Return the writer's task for one cycle; ``hint`` is a checkpoint number seen."""
        return {
            **base_task(self.home, cycle),
            "task": "loop",
            "seed": seed,
            "early": early,
            "threads": threads,
            "checkpoint_hint": hint,
            "workflows": list(self.workflows),
            "scopes": list(self.scopes),
            "run": self.run,
        }


@dataclass(frozen=True)
class Anomaly:
    """One thing the checker found wrong; ``kind`` tells controls what they must produce."""

    kind: str
    text: str


@dataclass
class LoopChecker:
    """Checks a store after each kill, incrementally, and once in full at the end.

    Each check verifies only the ledger events and records written since the
    previous one (chains are continued from the last verified tip, which is
    re-read to see it was not rewritten); the final check audits everything.
    """

    world: LoopWorld
    tips: dict[str, tuple[int, str]] = field(default_factory=dict)
    event_approvals: set[str] = field(default_factory=set)
    decided_approvals: dict[str, str] = field(default_factory=dict)
    """Approval id to its integrity digest, for every approval opened decided."""
    consumed_checkpoints: set[str] = field(default_factory=set)
    decision_events: int = 0
    watermark: datetime | None = None
    records_opened: int = 0
    events_verified: int = 0

    def check(self, runtime: Runtime, acks: list[dict[str, Any]]) -> list[Anomaly]:
        """Everything after one kill: file, chains, records, whole units, acknowledged writes."""
        began = datetime.now(UTC)
        found = [Anomaly("integrity", p) for p in integrity_problems(self._database(runtime))]
        found += _guarded("chain", lambda: self._streams(runtime))
        found += _guarded("record", lambda: self._records(runtime))
        found += _guarded("half", lambda: self._units(runtime, recount=False))
        found += [Anomaly("missing", p) for ack in acks if (p := self.missing(runtime, ack))]
        self.watermark = began - WATERMARK_SLACK
        return found

    def final(self, runtime: Runtime, acks: list[dict[str, Any]]) -> list[Anomaly]:
        """Everything again, from the first event and record: the full audit."""
        found = [Anomaly("integrity", p) for p in integrity_problems(self._database(runtime))]
        report = LedgerAudit(runtime.store, runtime.repository).run()
        found += [Anomaly("chain", f"final audit: {f}") for f in report.failures]
        unreadable = (report.records or {}).get(RecordReadability.UNREADABLE, 0)
        if unreadable or report.records is None:
            found.append(Anomaly("record", f"final audit: {unreadable} records do not open"))
        for workflow_id in self.world.workflows:
            try:
                runtime.workflow_events.events(workflow_id)
            except FlowvaultError as exc:
                found.append(Anomaly("chain", f"workflow {workflow_id} events: {exc}"))
        found += _guarded("half", lambda: self._units(runtime, recount=True))
        found += [Anomaly("missing", p) for ack in acks if (p := self.missing(runtime, ack))]
        return found

    @staticmethod
    def _database(runtime: Runtime) -> Path:
        return runtime.settings.database_path

    def _expected_streams(self) -> set[str]:
        """Streams named by what the writers made; record streams (keyed names) are not listed."""
        scopes = {history_stream(scope) for scope in self.world.scopes}
        return {stream_of(w) for w in self.world.workflows} | {run_stream(self.world.run)} | scopes

    def _streams(self, runtime: Runtime) -> list[Anomaly]:
        """Continue every chain from its verified tip; no stream the writers do not own."""
        found = []
        names = set(list_all_streams(runtime.store))
        for stray in sorted(names - self._expected_streams()):
            if stray.partition("/")[0] in RECORD_STREAM_KINDS:
                continue
            found.append(Anomaly("orphan", f"unexpected ledger stream {stray}"))
        for name in sorted(names):
            found += self._continue_chain(runtime, name)
        return found

    def _continue_chain(self, runtime: Runtime, stream: str) -> list[Anomaly]:
        start, tip = self.tips.get(stream, (0, GENESIS_HASH))
        store = runtime.store
        if start:
            last = store.read_ledger(stream, from_index=start - 1, limit=1).events
            if not last or last[0].index != start - 1 or last[0].event_hash != tip:
                return [
                    Anomaly("chain", f"{stream}: verified event {start - 1} changed or vanished")
                ]
        events: list[LedgerEvent] = []
        cursor: int | None = start
        while cursor is not None:
            page = store.read_ledger(stream, from_index=cursor, limit=200)
            events.extend(page.events)
            cursor = page.next_index
        verdict = verify_chain(events, start_index=start, previous_hash=tip)
        if not verdict.ok:
            return [Anomaly("chain", f"{stream}: {verdict.defect} at {verdict.first_bad_index}")]
        self.tips[stream] = (verdict.next_index, verdict.tip_hash)
        self.events_verified += len(events)
        found = []
        for event in events:
            if event.type == "approval.decided":
                digest = str(event.payload["approval"])  # type: ignore[index, call-overload]
                if digest in self.event_approvals:
                    found.append(Anomaly("duplicate", f"{stream}: approval decided twice"))
                self.event_approvals.add(digest)
                self.decision_events += 1
        return found

    def _records(self, runtime: Runtime) -> list[Anomaly]:
        """Open every record written since the last check; verify approvals and checkpoints."""
        found = []
        for namespace in sorted(runtime.store.namespace_counts()):  # type: ignore[attr-defined]
            for metadata in self._written_since(runtime, namespace):
                try:
                    self._open(runtime, namespace, metadata.key_digest)
                except FlowvaultError as exc:
                    found.append(Anomaly("record", f"{namespace} record does not open: {exc}"))
        return found

    def _written_since(self, runtime: Runtime, namespace: str) -> Iterator[Any]:
        cursor: str | None = None
        while True:
            page = runtime.store.list(
                namespace, order=Order.WRITTEN_AT_DESC, cursor=cursor, limit=LISTING_PAGE
            )
            for metadata in page.items:
                if self.watermark is not None and metadata.header.written_at < self.watermark:
                    return
                yield metadata
            cursor = page.next_cursor
            if cursor is None:
                return

    def _open(self, runtime: Runtime, namespace: str, key_digest: str) -> None:
        stored = runtime.store.load(namespace, key_digest)
        if stored is None:
            return
        opened = runtime.repository.open(stored, namespace=namespace, key_digest=key_digest)
        self.records_opened += 1
        document: Any = opened.document
        if namespace == APPROVALS:
            approval = runtime.approvals.get_approval(document["approval_id"])
            self.decided_approvals.pop(approval.approval_id, None)
            if approval.status.value == "decided":
                self.decided_approvals[approval.approval_id] = approval.integrity_digest
        elif namespace == CHECKPOINTS:
            checkpoint = runtime.checkpoints.load_checkpoint(document["checkpoint_id"])
            self.consumed_checkpoints.discard(checkpoint.checkpoint_id)
            if checkpoint.status is CheckpointStatus.CONSUMED:
                self.consumed_checkpoints.add(checkpoint.checkpoint_id)

    def _units(self, runtime: Runtime, *, recount: bool) -> list[Anomaly]:
        """No unit half-applied: records and their ledger events agree everywhere.

        Decisions are counted from the records opened so far, or with
        ``recount`` from the store's labels as well.
        """
        found = []
        store = runtime.store
        for workflow_id in self.world.workflows:
            try:
                record = runtime.workflows.get(workflow_id)
            except IntegrityFailure as failure:
                found.append(Anomaly("half", f"workflow {workflow_id}: {failure}"))
                continue
            head = store.ledger_head(stream_of(workflow_id))
            if head is None or (head.index + 1, head.to_state) != (
                record.state_version,
                record.state,
            ):
                found.append(
                    Anomaly(
                        "half",
                        f"workflow {workflow_id} at {record.state}@{record.state_version} "
                        f"but its ledger head is {head and (head.index, head.to_state)}",
                    )
                )
        for scope in self.world.scopes:
            snapshot = runtime.state(scope).load()
            document = snapshot.state.model_dump()
            revision = snapshot.revision or 0
            head = store.ledger_head(history_stream(scope))
            history = 0 if head is None else head.index + 1
            events = document.get("events", 0)
            if document.get("step", 0) != revision or events + revision != history:
                found.append(
                    Anomaly(
                        "half",
                        f"scope {scope}: revision {revision}, history {history}, "
                        f"document step {document.get('step')} events {document.get('events')}",
                    )
                )
        counts = store.namespace_counts()  # type: ignore[attr-defined]
        decided, consumed = len(self.decided_approvals), len(self.consumed_checkpoints)
        if recount:
            labelled = (
                _count(runtime, APPROVALS, "decided"),
                _count(runtime, CHECKPOINTS, CheckpointStatus.CONSUMED.value),
            )
            if labelled != (decided, consumed):
                found.append(
                    Anomaly("half", f"labels count {labelled}, records {decided, consumed}")
                )
        if not decided == consumed == self.decision_events:
            found.append(
                Anomaly(
                    "half",
                    f"{decided} decided approvals, {consumed} consumed checkpoints, "
                    f"{self.decision_events} approval.decided events",
                )
            )
        recorded = set(self.decided_approvals.values())
        if recorded != self.event_approvals:
            found.append(
                Anomaly(
                    "orphan",
                    f"{len(recorded - self.event_approvals)} decisions without an event, "
                    f"{len(self.event_approvals - recorded)} events without a decision",
                )
            )
        if counts.get(APPROVALS, 0) != counts.get(APPROVAL_SLOTS, 0):
            found.append(Anomaly("half", f"approvals and their slots differ: {counts}"))
        return found

    def missing(self, runtime: Runtime, ack: dict[str, Any]) -> str | None:
        """Why an acknowledged write is not in the store, or ``None`` when it is."""
        try:
            present = CHECKS[ack["k"]](self, runtime, ack)
        except FlowvaultError as exc:
            present = False
            ack = {**ack, "error": str(exc)}
        return None if present else f"acknowledged but missing: {ack}"


def _guarded(kind: str, check: Callable[[], list[Anomaly]]) -> list[Anomaly]:
    """Run one check; a store error while checking is itself an anomaly of ``kind``."""
    try:
        return check()
    except FlowvaultError as exc:
        return [Anomaly(kind, f"{type(exc).__name__}: {exc}")]


def _count(runtime: Runtime, namespace: str, status: str) -> int:
    total, cursor = 0, None
    while True:
        page = runtime.store.list(
            namespace, filters=[LabelFilter("status", status)], cursor=cursor, limit=200
        )
        total += len(page.items)
        cursor = page.next_cursor
        if cursor is None:
            return total


def _event_at(runtime: Runtime, stream: str, index: int) -> LedgerEvent | None:
    events = runtime.store.read_ledger(stream, from_index=index, limit=1).events
    return events[0] if events and events[0].index == index else None


def _has_transition(_: LoopChecker, runtime: Runtime, ack: dict[str, Any]) -> bool:
    record = runtime.workflows.get(ack["wf"])
    event = _event_at(runtime, stream_of(ack["wf"]), ack["v"] - 1)
    return record.state_version >= ack["v"] and event is not None and event.to_state == ack["state"]


def _has_update(_: LoopChecker, runtime: Runtime, ack: dict[str, Any]) -> bool:
    snapshot = runtime.state(ack["scope"]).load()
    if (snapshot.revision or 0) < ack["rev"]:
        return False
    stream = history_stream(ack["scope"])
    written = _event_at(runtime, stream, ack["events"] + ack["rev"] - 1)
    if written is None or written.payload != {"revision": ack["rev"]}:
        return False
    if not ack["history"]:
        return True
    event = _event_at(runtime, stream, ack["events"] + ack["rev"] - 2)
    return event is not None and event.payload == {"step": ack["rev"]}


def _has_result(_: LoopChecker, runtime: Runtime, ack: dict[str, Any]) -> bool:
    stored = runtime.action_results.get_action_result(ack["wf"], ack["hash"])
    return stored is not None and stored.result == ack["body"]


def _has_checkpoint(checker: LoopChecker, runtime: Runtime, ack: dict[str, Any]) -> bool:
    checkpoint_id = checkpoint_id_for(checker.world.run, {"n": ack["n"]})
    return bool(runtime.checkpoints.load_checkpoint(checkpoint_id).event_cursor == ack["n"])


def _has_request(_: LoopChecker, runtime: Runtime, ack: dict[str, Any]) -> bool:
    return bool(runtime.approvals.get_approval(ack["id"]).checkpoint_id == ack["cp"])


def _has_decision(checker: LoopChecker, runtime: Runtime, ack: dict[str, Any]) -> bool:
    approval = runtime.approvals.get_approval(ack["id"])
    checkpoint = runtime.checkpoints.load_checkpoint(ack["cp"])
    return (
        approval.status.value == "decided"
        and approval.decision == ack["decision"]
        and ack.get("digest", approval.integrity_digest) == approval.integrity_digest
        and checkpoint.status is CheckpointStatus.CONSUMED
        and approval.integrity_digest in checker.event_approvals
    )


CHECKS = {
    "transition": _has_transition,
    "update": _has_update,
    "result": _has_result,
    "checkpoint": _has_checkpoint,
    "request": _has_request,
    "decide": _has_decision,
}


def crash_cycle(
    server: ForkServer, task: dict[str, Any], rng: random.Random, where: str
) -> list[dict[str, Any]]:
    """Fork a writer, wait for a few acknowledgements, SIGKILL it 0-50 ms later; return its acks."""
    cycle = task["cycle"]
    wanted = rng.randint(1, MAX_ACKS_BEFORE_KILL)
    delay = rng.uniform(0, KILL_WINDOW)
    pid = server.fork(task)
    acks: list[dict[str, Any]] = []
    try:
        while len(acks) < wanted:
            ack = server.acks.next(ACK_TIMEOUT)
            assert ack is not None, f"{where}: no acknowledgement in {ACK_TIMEOUT} s"
            acks.append(ack)
            if ack["k"] == "error":
                break
        else:
            time.sleep(delay)
    finally:
        ended = server.kill(pid)
    acks += server.acks.drain()
    raise_on_error(acks, where)
    check_killed(ended, where, server)
    assert {ack["c"] for ack in acks} == {cycle}, f"{where}: acknowledgements of another writer"
    return acks


@dataclass
class LoopRun:
    """What one crash loop did, for the figure and the assertion message."""

    kills: int = 0
    acks: list[dict[str, Any]] = field(default_factory=list)
    anomalies: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    threaded_kills: int = 0
    grouped_units: int = 0
    """Units the killed writers committed in a transaction shared with others."""
    marks_behind: int = 0
    """Reopens after a kill that found the high-water mark trailing the store, as it may."""


def crash_loop(
    server: ForkServer, world: LoopWorld, kills: int, seed: int, *, early: bool, stop: bool
) -> tuple[LoopRun, LoopChecker]:
    """Kill ``kills`` writers in turn, checking the store after each; ``stop`` at an anomaly.

    Every other writer (except in the control) runs ``LANES`` threads over
    one runtime, so the group-commit path is killed as often as the lone one.
    """
    rng = random.Random(seed)
    checker = LoopChecker(world)
    run = LoopRun()
    hint = -1
    for cycle in range(kills):
        threads = 1 if early or cycle % 2 == 0 else LANES
        task = world.task(cycle, rng.getrandbits(32), early=early, hint=hint, threads=threads)
        acks = crash_cycle(server, task, rng, f"seed {seed} cycle {cycle}")
        run.kills += 1
        run.acks += acks
        if threads > 1:
            run.threaded_kills += 1
            run.grouped_units += max((int(ack.get("g", 0)) for ack in acks), default=0)
        hint = max([hint, *(ack["n"] for ack in acks if ack["k"] == "checkpoint")])
        left = mark_of(world.home).read()
        with open_runtime(world.home) as runtime:
            run.marks_behind += mark_trailed(left, runtime)
            found = checker.check(runtime, acks)
        run.anomalies += [f"seed {seed} cycle {cycle}: [{a.kind}] {a.text}" for a in found]
        run.kinds += [a.kind for a in found]
        if stop and found:
            break
    if not stop:
        with open_runtime(world.home) as runtime:
            found = checker.final(runtime, run.acks)
        run.anomalies += [f"seed {seed} final: [{a.kind}] {a.text}" for a in found]
        run.kinds += [a.kind for a in found]
    return run, checker


def half_applied_units(world: LoopWorld, checker: LoopChecker) -> list[Anomaly]:
    """Commit half of two units by hand; return what the checker then calls half-applied.

    A workflow gets a transition event without its record change, and a scope
    a state that counts a history event never appended: what a torn commit
    would leave.
    """
    with open_runtime(world.home) as runtime:
        workflow_id = world.workflows[0]
        record = runtime.workflows.get(workflow_id)
        head = runtime.store.ledger_head(stream_of(workflow_id))
        assert head is not None
        orphan = LedgerEvent.create(
            stream=stream_of(workflow_id),
            index=head.index + 1,
            type="workflow.transitioned",
            occurred_at=runtime.clock.now(),
            payload={},
            previous_hash=head.event_hash,
            from_state=record.state,
            to_state=worker.NEXT_STATE[record.state],
        )
        runtime.store.commit(UnitOfWork(appends=[orphan]))
        runtime.state(world.scopes[0]).update(lambda s: worker.advanced_state(s, history=True))
    with open_runtime(world.home) as runtime:
        return [a for a in checker.check(runtime, []) if a.kind == "half"]


def test_sigkill_crash_loop_keeps_every_acknowledged_write_whole(tmp_path: Path) -> None:
    """A writer SIGKILLed at random loses no acknowledged write and half-applies no unit.

    Killed 0-50 ms after an acknowledgement, hundreds of times over one store,
    half of the time as four threads whose units share transactions (group
    commit), it leaves a file that passes ``integrity_check``, chains that verify,
    records that open, and workflows and scopes whose records agree with their
    ledgers. A writer that acknowledges before it writes, and units torn by
    hand, are caught by the same checker.
    """
    seed = reliability.seed_base()
    kills = reliability.size(300, 3000)
    watch = reliability.Stopwatch()
    with fork_server(tmp_path, "crash-loop") as server:
        world = LoopWorld.create(tmp_path / "vault")
        run, checker = crash_loop(server, world, kills, seed, early=False, stop=False)
        control_world = LoopWorld.create(tmp_path / "control")
        control, control_checker = crash_loop(
            server, control_world, CONTROL_LIMIT, seed + 1, early=True, stop=True
        )
    halves = half_applied_units(control_world, control_checker)
    torn = {a.text.split()[0] for a in halves} == {"workflow", "scope"}
    caught = "missing" in control.kinds and torn
    kinds = Counter(ack["k"] for ack in run.acks)
    reliability.record(
        reliability.Figure(
            family="SIGKILL crash loop (SQLite)",
            trials=run.kills,
            anomalies=len(run.anomalies),
            control_caught=caught,
            detail=(
                f"{len(run.acks)} acknowledged writes checked "
                f"({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}); "
                f"{checker.events_verified} ledger events verified, "
                f"{checker.records_opened} record opens; {run.threaded_kills} kills of "
                f"{LANES}-thread writers, which committed {run.grouped_units} units in "
                f"shared transactions (group commit); {run.marks_behind} reopens found "
                f"the high-water mark trailing the store, none refused; control (ack "
                f"before commit) caught after {control.kills} kills: "
                f"{control.kinds.count('missing')} acknowledged writes missing, and "
                f"{len(halves)} hand-torn units seen as half-applied; seed {seed}"
            ),
            seconds=watch.seconds,
        )
    )
    assert not run.anomalies, "\n".join(run.anomalies[:20])
    assert run.grouped_units > 0, "no killed writer committed a unit through group commit"
    assert "missing" in control.kinds, f"seed {seed + 1}: ack-before-commit not caught: {control}"
    assert torn, f"seed {seed + 1}: hand-torn units not all seen as half-applied: {halves}"


# -- the commit/ack window ------------------------------------------------------

RETRY_OPS = ("create", "event", "remember", "decide")
CONTROL_OPS = ("create", "event", "remember")
"""Calls whose retry can forget the original key; a decision has none."""
TARGET_BEFORE = 0.4
"""Share of kills the timing aims to land before the commit; most others land in the window."""
BARE_ACK_SHARE = 0.3
"""Share of calls acknowledged at once, so some kills also land after the acknowledgement."""


@dataclass(frozen=True)
class RetryWorld:
    """A store with a workflow for keyed events and a run whose approvals are decided."""

    home: Path
    workflow: str
    run: str

    @classmethod
    def create(cls, home: Path) -> RetryWorld:
        """Set up the shared workflow (executing) and a running graph run."""
        with open_runtime(home) as runtime:
            workflows = runtime.workflows
            record, _ = workflows.create(
                WorkOrder(
                    kind="retry.shared",
                    parameters={},
                    requester="host@example.org",
                    idempotency_key="retry-shared",
                )
            )
            workflows.transition(
                record.workflow_id, "planning", expected_state="intake", expected_version=1
            )
            workflows.transition(
                record.workflow_id, "executing", expected_state="planning", expected_version=2
            )
            runtime.definitions.register_definition("retry.run", {"nodes": ["approve"]})
            run, _ = runtime.runs.start_run("retry.run", {"retry": True})
            runtime.runs.set_status(run.run_id, "running", expected_status="accepted")
        return cls(home, record.workflow_id, run.run_id)


class KillTiming:
    """Draws when to kill after ``go`` and how long the writer holds its acknowledgement.

    The delay span adapts until about ``TARGET_BEFORE`` of the kills find no
    effect, whatever the machine's speed; the rest land after the commit, and
    since most writers hold their acknowledgement longer than any delay, most
    of those land between the commit and the acknowledgement.
    """

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._span = 0.02

    def draw(self) -> tuple[float, float]:
        """Return ``(hold, delay)`` for the next cycle."""
        hold = 0.0 if self._rng.random() < BARE_ACK_SHARE else self._span
        return hold, self._rng.uniform(0, self._span)

    def learn(self, *, before_commit: bool) -> None:
        """Lengthen the span after a kill that came too early, shorten it otherwise."""
        factor = 1 + 0.3 * (1 - TARGET_BEFORE) if before_commit else 1 - 0.3 * TARGET_BEFORE
        self._span = min(max(self._span * factor, 0.001), 1.0)


SAME_RESULT = {
    "create": ("id",),
    "event": ("index", "hash"),
    "remember": ("response",),
    "decide": ("digest", "checkpoint"),
}
"""The fields that must match between the original result and a retry's."""

EFFECT_COUNTS = {
    "create": "workflows",
    "event": "shared_events",
    "remember": "remembered",
    "decide": "decision_events",
}
"""Which count a call of each kind must raise by exactly one."""


def same(op: str, first: dict[str, Any], second: dict[str, Any]) -> bool:
    """Whether two results of ``op`` are the same result."""
    return all(first[name] == second[name] for name in SAME_RESULT[op])


def excess(op: str, before: dict[str, int], after: dict[str, int]) -> int:
    """Count effects beyond the one the call of ``op`` should have made."""
    return sum(
        max(0, after[name] - before[name] - (1 if EFFECT_COUNTS[op] == name else 0))
        for name in before
    )


@dataclass
class RetryRun:
    """What the window harness saw, for the figure and the assertion message."""

    cycles: int = 0
    before_commit: int = 0
    in_window: int = 0
    after_ack: int = 0
    duplicates: int = 0
    anomalies: list[str] = field(default_factory=list)
    ops: Counter[str] = field(default_factory=Counter)

    def judge(
        self,
        where: str,
        call: dict[str, Any],
        acked: dict[str, Any] | None,
        checked: dict[str, Any],
        books: dict[str, int],
    ) -> bool:
        """Judge one killed call from its retry's report; return whether the kill found no effect.

        The original result is the acknowledged one, or the effect in the
        store when the kill came before the acknowledgement.
        """
        op, effect, again = call["op"], checked["effect"], checked["again"]
        if acked is not None and (effect is None or not same(op, acked, effect)):
            self.anomalies.append(f"{where}: acknowledged {acked} but the store holds {effect}")
        original = acked or effect
        if original is not None and not same(op, original, again):
            self.anomalies.append(f"{where}: retry returned {again}, the original was {original}")
        extra = excess(op, books, checked["books"])
        if extra:
            self.anomalies.append(f"{where}: {extra} duplicate effects after the retry")
        self.cycles += 1
        self.ops[op] += 1
        self.duplicates += extra
        if effect is None:
            self.before_commit += 1
        elif acked is None:
            self.in_window += 1
        else:
            self.after_ack += 1
        return effect is None


def window_cycles(
    server: ForkServer, world: RetryWorld, count: int, seed: int, *, fresh_key: bool
) -> RetryRun:
    """Kill a writer around ``count`` idempotent calls; each next writer retries the last call.

    With ``fresh_key`` the retry is the negative control: it forgets the key,
    and the harness stops at the first duplicate.
    """
    rng = random.Random(seed)
    timing = KillTiming(rng)
    run = RetryRun()
    with open_runtime(world.home) as runtime:
        books = worker.books_of(runtime, world.workflow, world.run)
    previous: dict[str, Any] | None = None
    acked: dict[str, Any] | None = None
    for number in range(count + 1):
        op = rng.choice(CONTROL_OPS if fresh_key else RETRY_OPS) if number < count else None
        call = None if op is None else {"n": number, "op": op, "key": f"{op}-{number}"}
        where = f"seed {seed} window cycle {number}"
        hold, delay = timing.draw()
        task = {
            **base_task(world.home, number),
            "task": "retry",
            "wf": world.workflow,
            "run": world.run,
            "previous": previous,
            "books": books,
            "fresh": fresh_key,
            "next": call and {**call, "approval": None},
            "hold": hold,
        }
        reports = kill_around_commit(server, task, delay, where)
        if previous is not None:
            checked = reports["checked"]
            early = run.judge(f"{where} ({previous['op']})", previous, acked, checked, books)
            timing.learn(before_commit=early)
            books = checked["books"]
            if fresh_key and run.duplicates:
                break
        previous = reports["go"]["cycle"] if "go" in reports else None
        acked = reports["done"]["result"] if "done" in reports else None
    return run


def kill_around_commit(
    server: ForkServer, task: dict[str, Any], delay: float, where: str
) -> dict[str, dict[str, Any]]:
    """Fork a writer, SIGKILL it ``delay`` after its ``go`` (or once idle); return its reports."""
    pid = server.fork(task)
    reports: dict[str, dict[str, Any]] = {}
    try:
        while not {"go", "idle", "error"} & set(reports):
            ack = server.acks.next(ACK_TIMEOUT)
            assert ack is not None, f"{where}: the writer never reached its call"
            reports[ack["k"]] = ack
        if "go" in reports:
            done = server.acks.next(delay)
            if done is not None:
                reports[done["k"]] = done
    finally:
        ended = server.kill(pid)
    for ack in server.acks.drain():
        reports[ack["k"]] = ack
    raise_on_error(list(reports.values()), where)
    check_killed(ended, where, server)
    return reports


def test_sigkill_between_commit_and_ack_retries_without_duplicates(tmp_path: Path) -> None:
    """A retry after a kill between commit and ack returns the original result, once.

    A writer is SIGKILLed around an idempotent call (workflow create, keyed
    event, request-bound response, approval decision), often after its commit
    but before its acknowledgement. Retried with the same key, the call returns
    the original result and makes no second effect or ledger event. A retry
    with a fresh key makes a duplicate, and the same counter sees it.
    """
    seed = reliability.seed_base()
    cycles = reliability.size(500, 5000)
    watch = reliability.Stopwatch()
    with fork_server(tmp_path, "window") as server:
        world = RetryWorld.create(tmp_path / "vault")
        run = window_cycles(server, world, cycles, seed, fresh_key=False)
        with open_runtime(world.home) as runtime:
            problems = integrity_problems(runtime.settings.database_path)
            run.anomalies += [f"seed {seed} final: {p}" for p in problems]
            report = LedgerAudit(runtime.store, runtime.repository).run()
            run.anomalies += [f"seed {seed} final audit: {f}" for f in report.failures]
            if (report.records or {}).get(RecordReadability.UNREADABLE, 0):
                run.anomalies.append(f"seed {seed} final audit: unreadable records {report}")
        control_world = RetryWorld.create(tmp_path / "control")
        control = window_cycles(server, control_world, CONTROL_LIMIT, seed + 1, fresh_key=True)
    caught = control.duplicates > 0
    reliability.record(
        reliability.Figure(
            family="SIGKILL commit/ack window retry",
            trials=run.cycles,
            anomalies=len(run.anomalies),
            control_caught=caught,
            detail=(
                f"{run.in_window} kills landed between commit and ack, {run.before_commit} "
                f"before the commit, {run.after_ack} after the ack; "
                f"{', '.join(f'{n} {op}' for op, n in sorted(run.ops.items()))}; "
                f"{run.duplicates} duplicates; control (fresh key) caught "
                f"{control.duplicates} duplicate after {control.cycles} cycles; seed {seed}"
            ),
            seconds=watch.seconds,
        )
    )
    assert not run.anomalies, "\n".join(run.anomalies[:20])
    assert run.in_window > 0, f"seed {seed}: no kill landed between commit and ack"
    assert caught, f"seed {seed + 1}: the fresh-key retry made no duplicate the counter saw"
