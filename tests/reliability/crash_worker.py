"""A fork server for the SIGKILL families in ``test_crash_loop.py``.

Usage: ``crash_worker.py ACK_FD``. The server is a fresh interpreter that
imports flowvault once, opens no store and starts no thread, so forking it
is safe and cheap. It reads one JSON request per line on stdin and answers
one JSON line on stdout:

- ``{"op": "fork", "task": {...}}`` forks a child that runs the task and
  answers ``{"pid": N}``;
- ``{"op": "reap", "pid": N}`` waits for that child and answers how it
  ended (``signal`` or ``code``).

A child opens the store itself (a store refuses to be used across ``fork``),
does its work and reports every write it has acknowledged on ``ACK_FD`` as
one JSON line written with a single ``os.write``, so a line shorter than
``PIPE_BUF`` is either wholly in the pipe or not at all when the child is
killed. Each line carries the child's ``cycle``. A child never exits on its
own: it loops, or pauses after its one write, until the test SIGKILLs it.

Tasks:

- ``loop``: the crash loop's writer. It continues the workflows, state
  scopes and run the test set up, one unit of work at a time, chosen by
  its seed: a workflow transition, a state update, an action result, or an
  approval (checkpoint, request, decision). With ``threads`` above one it
  runs that many lanes over one runtime, whose units meet in the store's
  group commit. With ``early`` set it is the broken variant that
  acknowledges each write before making it.
- ``retry``: a restarted host. It first retries the killed writer's call
  with the same key (or, as the negative control, a fresh one) and reports
  what the store held, what the retry returned and the effect counts after
  it (``checked``). Then it makes one idempotent call of its own
  (``create``, ``event``, ``remember`` or ``decide``): ``go`` just before
  it, the result (``done``) after holding it back for ``hold`` seconds, so
  a kill often lands after the commit and before the acknowledgement.
"""

from __future__ import annotations

import base64
import gc
import json
import os
import queue
import random
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn

from flowvault.application import HistoryEvent
from flowvault.application._record_kinds import REQUEST_IDEMPOTENCY
from flowvault.application._streams import run_stream
from flowvault.application._workflow_records import WORKFLOWS, stream_of
from flowvault.application._workflows import IDEMPOTENCY
from flowvault.composition import Runtime, Settings, bootstrap
from flowvault.domain import (
    ApprovalAlreadyDecided,
    ApprovalStatus,
    Checkpoint,
    CheckpointStatus,
    NotFound,
    WorkflowState,
    WorkOrder,
    content_hash,
)
from flowvault.domain._approvals import checkpoint_id_for

NEXT_STATE = {"intake": "planning", "planning": "executing", "executing": "decision"}
NEXT_STATE["decision"] = "executing"
"""A workflow cycles between executing and decision forever, so a writer never runs out of work."""

APPROVAL_EXPIRY = datetime(2100, 1, 1, tzinfo=UTC)
"""Fixed, so a writer that restarts asks the same request and gets the pending approval back."""

RESULT_RETENTION = timedelta(days=30)
CHILD_ALARM_SECONDS = 300
"""A child the test forgot to kill (the test itself died) ends on its own."""
MAX_ACK_BYTES = 4000
"""Below ``PIPE_BUF`` (4096 on Linux), so every acknowledgement is written atomically."""

Task = dict[str, Any]


class Acks:
    """Writes acknowledgements to the test, one atomic line each, tagged with the cycle."""

    def __init__(self, fd: int, cycle: int) -> None:
        self._fd = fd
        self._cycle = cycle

    def send(self, kind: str, **fields: object) -> None:
        """Report one acknowledged write (or ``go``/``error``) to the test."""
        line = json.dumps({"c": self._cycle, "k": kind, **fields}, sort_keys=True) + "\n"
        data = line.encode()
        if len(data) > MAX_ACK_BYTES:
            raise ValueError(f"acknowledgement too long for one atomic write: {len(data)} bytes")
        os.write(self._fd, data)


def open_runtime(task: Task) -> Runtime:
    """Open the store over the test's home with its key, fully synchronous."""
    key = base64.urlsafe_b64decode(task["master"])
    return bootstrap(Settings(home=Path(task["home"]), synchronous="full"), key=key, create=True)


# -- the crash loop's writer ----------------------------------------------------


class LoopWriter:
    """Continues the test's workflows, scopes and run, acknowledging each write."""

    def __init__(self, runtime: Runtime, task: Task, acks: Acks) -> None:
        self._rt = runtime
        self._task = task
        self._acks = acks
        self._rng = random.Random(task["seed"])
        self._early = bool(task["early"])
        self._results = 0

    def run(self) -> NoReturn:
        """Do units of work until killed."""
        units: list[Callable[[], None]] = [self.transition, self.update, self.action_result]
        if self._task.get("approvals", True):
            units.append(self.approval)
        while True:
            self._rng.choice(units)()

    def _ack(self, planned: bool, kind: str, **fields: object) -> None:
        """Send now if this is the point the variant acknowledges at (before or after the call).

        Each acknowledgement carries how many units this writer's store has
        so far committed in a transaction shared with other units (``g``).
        """
        if planned == self._early:
            counts = getattr(self._rt.store, "commit_counts", None)
            self._acks.send(kind, g=0 if counts is None else counts.grouped_units, **fields)

    def transition(self) -> None:
        """Move one workflow to its next state: the record and its ledger event, one unit."""
        workflow_id = self._rng.choice(self._task["workflows"])
        current = self._rt.workflows.get(workflow_id)
        target = NEXT_STATE[current.state]
        version = current.state_version + 1
        self._ack(True, "transition", wf=workflow_id, v=version, state=target)
        done = self._rt.workflows.transition(
            workflow_id,
            target,
            expected_state=current.state,
            expected_version=current.state_version,
            payload={"step": version},
        )
        self._ack(False, "transition", wf=workflow_id, v=done.state_version, state=done.state)

    def update(self) -> None:
        """Advance a scope's state; half the time with a history event in the same unit.

        The document counts its own updates (``step``) and history events
        (``events``); every update also appends its ``workflow_state.written``
        event, so the history head sits at ``step + events`` and a
        half-applied unit shows as a mismatch with the revision or that head.
        """
        scope = self._rng.choice(self._task["scopes"])
        repo = self._rt.state(scope)
        seen = repo.load()
        history = self._rng.random() < 0.5
        events = int(getattr(seen.state, "events", 0)) + (1 if history else 0)
        step = (seen.revision or 0) + 1
        self._ack(True, "update", scope=scope, rev=step, events=events, history=history)
        if history:
            new, revision = repo.update_with_events(
                lambda s: _with_history(advanced_state(s, True))
            )
        else:
            new, revision = repo.update(lambda s: advanced_state(s, history=False))
        events = int(getattr(new, "events", 0))
        self._ack(False, "update", scope=scope, rev=revision, events=events, history=history)

    def action_result(self) -> None:
        """Seal an action result for a workflow, kept for the longest retention."""
        workflow_id = self._rng.choice(self._task["workflows"])
        self._results += 1
        body = {"cycle": self._task["cycle"], "n": self._results, "wf": workflow_id}
        action = content_hash(body)
        self._ack(True, "result", wf=workflow_id, hash=action, body=body)
        self._rt.action_results.put_action_result(
            workflow_id, action, body, retention=RESULT_RETENTION
        )
        self._ack(False, "result", wf=workflow_id, hash=action, body=body)

    def approval(self) -> None:
        """Checkpoint the run (unless a pending checkpoint is left), ask, then decide.

        Restart-safe: a pending checkpoint left by a killed writer is reused,
        and asking again returns the approval it already requested.
        """
        run_id = self._task["run"]
        latest = self._newest_checkpoint()
        if latest is None or latest.status is not CheckpointStatus.PENDING:
            n = 0 if latest is None else latest.event_cursor + 1
            self._ack(True, "checkpoint", n=n)
            latest = self._rt.checkpoints.create_checkpoint(
                run_id,
                {"n": n},
                state={"n": n},
                budgets={"tokens": 1000 - n},
                counters={"n": n},
                dependency_summary={"tools": ["ledger"]},
                terminal_cursor=None,
                event_cursor=n,
            )
            self._ack(False, "checkpoint", n=n, id=latest.checkpoint_id)
        approvals = self._rt.approvals
        approval = approvals.request_approval(
            latest.checkpoint_id,
            expected_state_digest=latest.state_digest,
            expected_budgets=latest.budgets,
            expected_counters=latest.counters,
            expected_dependency_digest=latest.dependency_digest,
            audience="operators",
            prompt_digest=content_hash({"approve": latest.event_cursor}),
            allowed_decisions=["approve", "reject"],
            expires_at=APPROVAL_EXPIRY,
        )
        self._acks.send("request", id=approval.approval_id, cp=latest.checkpoint_id)
        decision = self._rng.choice(["approve", "reject"])
        self._ack(
            True, "decide", id=approval.approval_id, cp=latest.checkpoint_id, decision=decision
        )
        decided, _ = approvals.decide(approval.approval_id, decision, "operator@example.org")
        self._ack(
            False,
            "decide",
            id=decided.approval_id,
            cp=latest.checkpoint_id,
            decision=decision,
            digest=decided.integrity_digest,
        )

    def _newest_checkpoint(self) -> Checkpoint | None:
        """Find the run's newest checkpoint, starting from the test's hint.

        Checkpoint ``n`` has an id that follows from ``n``, and they are made
        in order, so a few loads find the newest whatever the run's length.
        """
        n = int(self._task["checkpoint_hint"])
        while n >= 0 and self._checkpoint(n) is None:
            n -= 1
        while self._checkpoint(n + 1) is not None:
            n += 1
        return None if n < 0 else self._checkpoint(n)

    def _checkpoint(self, n: int) -> Checkpoint | None:
        try:
            return self._rt.checkpoints.load_checkpoint(
                checkpoint_id_for(self._task["run"], {"n": n})
            )
        except NotFound:
            return None


def advanced_state(state: WorkflowState, history: bool) -> WorkflowState:
    """Count one more update, and one more history event when ``history``."""
    fields = state.model_dump()
    fields["step"] = int(fields.get("step", 0)) + 1
    fields["events"] = int(fields.get("events", 0)) + (1 if history else 0)
    return WorkflowState(**fields)


def _with_history(state: WorkflowState) -> tuple[WorkflowState, list[HistoryEvent]]:
    fields = state.model_dump()
    return state, [HistoryEvent("state.stepped", {"step": fields["step"]})]


def run_loop(task: Task, acks: Acks) -> NoReturn:
    """Run the crash loop's writer until it is killed; with ``threads`` > 1, as that many lanes.

    Lanes share one runtime, so their units meet in the store's group
    commit; each lane owns its own workflows and scopes (lane 0 also the
    run's approvals), so lanes never conflict with each other.
    """
    runtime = open_runtime(task)
    threads = int(task.get("threads", 1))
    if threads == 1:
        LoopWriter(runtime, task, acks).run()
    failures: queue.SimpleQueue[str] = queue.SimpleQueue()
    for lane in range(threads):
        lane_task = {
            **task,
            "seed": task["seed"] + lane,
            "workflows": task["workflows"][lane::threads],
            "scopes": task["scopes"][lane::threads],
            "approvals": lane == 0,
        }
        writer = LoopWriter(runtime, lane_task, acks)
        threading.Thread(target=_lane, args=(writer, failures), daemon=True).start()
    raise RuntimeError(f"a writer lane failed:\n{failures.get()}")


def _lane(writer: LoopWriter, failures: queue.SimpleQueue[str]) -> None:
    try:
        writer.run()
    except BaseException:
        failures.put(traceback.format_exc())


# -- the commit/ack window child ------------------------------------------------


def run_retry(task: Task, acks: Acks) -> NoReturn:
    """Retry the killed writer's call, then make this cycle's call and hold its ack briefly.

    The retry comes first, as a restarted host's would: what the store held
    after the kill, what the retry returned, and the counts after it are
    reported (``checked``) before this cycle's call starts (``go``).
    """
    runtime = open_runtime(task)
    if task["previous"] is not None:
        acks.send("checked", **check_previous(runtime, task))
    cycle = task["next"]
    if cycle is None:
        acks.send("idle")
        _pause_forever()
    if cycle["op"] == "decide":
        cycle = {**cycle, "approval": prepare_approval(runtime, task["run"], cycle["n"])}
    acks.send("go", cycle=cycle)
    result = perform(runtime, task, cycle, cycle["key"], attempt=1)
    time.sleep(task["hold"])
    acks.send("done", result=result)
    _pause_forever()


def _pause_forever() -> NoReturn:
    while True:
        signal.pause()


def check_previous(runtime: Runtime, task: Task) -> dict[str, Any]:
    """Find the previous call's effect, retry the call, and count every kind of effect."""
    previous = task["previous"]
    effect = effect_of(runtime, task, previous)
    key = f"{previous['key']}-fresh" if task["fresh"] else previous["key"]
    again = perform(runtime, task, previous, key, attempt=2)
    return {"effect": effect, "again": again, "books": books_of(runtime, task["wf"], task["run"])}


def perform(
    runtime: Runtime, task: Task, cycle: dict[str, Any], key: str, *, attempt: int
) -> dict[str, Any]:
    """Make a cycle's call under ``key``; the first attempt and every retry are the same call."""
    number, op = cycle["n"], cycle["op"]
    workflows = runtime.workflows
    if op == "create":
        record, created = workflows.create(retry_order(number, key))
        return {"id": record.workflow_id, "created": created}
    if op == "event":
        current = workflows.get(task["wf"])
        _, event, created = runtime.workflow_events.append_event(
            task["wf"],
            "note.recorded",
            expected_state=current.state,
            expected_version=current.state_version,
            payload={"cycle": number},
            event_key=key,
        )
        return {"index": event.index, "hash": event.event_hash, "created": created}
    if op == "remember":
        response = retry_response(number, attempt=attempt)
        return {"response": runtime.idempotency.remember(key, retry_request(number), response)}
    try:
        decided, _ = runtime.approvals.decide(cycle["approval"], "approve", RETRY_ACTOR)
    except ApprovalAlreadyDecided:
        decided = runtime.approvals.get_approval(cycle["approval"])
    return {"digest": decided.integrity_digest, "checkpoint": decided.checkpoint_id}


def effect_of(runtime: Runtime, task: Task, cycle: dict[str, Any]) -> dict[str, Any] | None:
    """Return the effect a cycle's call left in the store, or ``None`` if it left none."""
    op = cycle["op"]
    if op == "create":
        marker = runtime.repository.read(IDEMPOTENCY, cycle["key"])
        document: Any = None if marker is None else marker.document
        return None if document is None else {"id": document["workflow_id"]}
    if op == "event":
        index = task["books"]["shared_events"]
        events = runtime.store.read_ledger(stream_of(task["wf"]), from_index=index, limit=1).events
        if not events:
            return None
        return {"index": events[0].index, "hash": events[0].event_hash}
    if op == "remember":
        response = runtime.idempotency.recall(cycle["key"], retry_request(cycle["n"]))
        return None if response is None else {"response": response}
    approval = runtime.approvals.get_approval(cycle["approval"])
    if approval.status is not ApprovalStatus.DECIDED:
        return None
    return {"digest": approval.integrity_digest, "checkpoint": approval.checkpoint_id}


def books_of(runtime: Runtime, workflow_id: str, run_id: str) -> dict[str, int]:
    """Count each kind of effect: workflows, shared events, responses, decision events."""
    counts: dict[str, int] = runtime.store.namespace_counts()  # type: ignore[attr-defined]

    def length(stream: str) -> int:
        head = runtime.store.ledger_head(stream)
        return 0 if head is None else head.index + 1

    return {
        "workflows": counts.get(WORKFLOWS, 0),
        "shared_events": length(stream_of(workflow_id)),
        "remembered": counts.get(REQUEST_IDEMPOTENCY, 0),
        "decision_events": length(run_stream(run_id)),
    }


def prepare_approval(runtime: Runtime, run_id: str, cycle: int) -> str:
    """Checkpoint the run and request the approval a ``decide`` cycle will decide."""
    checkpoint = runtime.checkpoints.create_checkpoint(
        run_id,
        {"cycle": cycle},
        state={"cycle": cycle},
        budgets={},
        counters={"cycle": cycle},
        dependency_summary=None,
        terminal_cursor=None,
        event_cursor=cycle,
    )
    approval = runtime.approvals.request_approval(
        checkpoint.checkpoint_id,
        expected_state_digest=checkpoint.state_digest,
        expected_budgets=checkpoint.budgets,
        expected_counters=checkpoint.counters,
        expected_dependency_digest=checkpoint.dependency_digest,
        audience="approvers",
        prompt_digest=content_hash({"cycle": cycle}),
        allowed_decisions=["approve"],
        expires_at=APPROVAL_EXPIRY,
    )
    return approval.approval_id


RETRY_ACTOR = "approver@example.org"


def retry_order(cycle: int, key: str) -> WorkOrder:
    """Build the work order of a ``create`` cycle under ``key``."""
    return WorkOrder(
        kind="retry.create",
        parameters={"cycle": cycle},
        requester="host@example.org",
        idempotency_key=key,
    )


def retry_request(cycle: int) -> dict[str, Any]:
    """Build the request a ``remember`` cycle binds its response to."""
    return {"charge": cycle, "amount": 10 * cycle}


def retry_response(cycle: int, *, attempt: int) -> dict[str, Any]:
    """Build a response naming its attempt, so a replay shows which attempt won."""
    return {"receipt": f"r-{cycle}", "attempt": attempt}


# -- the server -----------------------------------------------------------------

TASKS: dict[str, Callable[[Task, Acks], NoReturn]] = {"loop": run_loop, "retry": run_retry}


def child(task: Task, ack_fd: int) -> NoReturn:
    """Run one task in a forked child; report a failure on the pipe; never return."""
    signal.alarm(CHILD_ALARM_SECONDS)
    acks = Acks(ack_fd, int(task["cycle"]))
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(2, 1)
        TASKS[task["task"]](task, acks)
    except BaseException:
        trace = traceback.format_exc()
        sys.stderr.write(trace)
        sys.stderr.flush()
        try:
            acks.send("error", trace=trace[-1500:])
        finally:
            os._exit(70)


def reply(message: dict[str, Any]) -> None:
    """Answer the test on stdout."""
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def warm_up() -> None:
    """Run every call once on a throwaway in-memory store, so children do not pay first-use costs.

    Lazy imports and first-call set-up would otherwise be repeated in every
    forked child; the memory store holds no file or connection to inherit.
    """
    # a home that cannot be created: the memory store must not touch the disk
    settings = Settings(backend="memory", home=Path(os.devnull).with_name("flowvault-unused"))
    with bootstrap(settings, key=bytes(32), create=True) as runtime:
        task: Task = {"cycle": 0, "seed": 0, "early": False, "checkpoint_hint": 0}
        workflow_id = runtime.workflows.create(retry_order(0, "warm"))[0].workflow_id
        runtime.definitions.register_definition("warm", {"nodes": []})
        run, _ = runtime.runs.start_run("warm", {})
        task.update(workflows=[workflow_id], scopes=["warm"], run=run.run_id, wf=workflow_id)
        writer = LoopWriter(runtime, task, _Silent())
        for unit in (writer.transition, writer.update, writer.update, writer.action_result):
            unit()
        writer.approval()
        task["books"] = books_of(runtime, workflow_id, run.run_id)
        for op in ("event", "remember", "decide"):
            cycle = {"n": 0, "op": op, "key": "warm", "approval": None}
            if op == "decide":
                cycle["approval"] = prepare_approval(runtime, run.run_id, 0)
            perform(runtime, task, cycle, "warm", attempt=1)
            effect_of(runtime, task, cycle)


class _Silent(Acks):
    """Acknowledges to no one, for the warm-up."""

    def __init__(self) -> None:
        super().__init__(-1, 0)

    def send(self, kind: str, **fields: object) -> None:
        """Drop the acknowledgement."""


def serve(ack_fd: int) -> None:
    """Fork and reap children on request until stdin closes; then kill any left.

    Everything the warm-up allocated is frozen out of the garbage collector,
    so a child's collections do not touch (and copy) the server's pages.
    """
    warm_up()
    gc.freeze()
    if threading.active_count() != 1:
        raise RuntimeError(f"the fork server must be single-threaded: {threading.enumerate()}")
    living: set[int] = set()
    reply({"ready": os.getpid()})
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "fork":
            pid = os.fork()
            if pid == 0:
                child(request["task"], ack_fd)
            living.add(pid)
            reply({"pid": pid})
        elif request["op"] == "reap":
            pid, status = os.waitpid(int(request["pid"]), 0)
            living.discard(pid)
            reply(
                {
                    "pid": pid,
                    "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                    "code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
                }
            )
        else:
            raise ValueError(f"unknown request {request!r}")
    for pid in living:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


if __name__ == "__main__":
    serve(int(sys.argv[1]))
