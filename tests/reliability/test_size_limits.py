"""Every documented limit, at the limit and one step past it, on each backend.

``docs/limits.md`` lists each size, length and range flowvault enforces.
For every row this harness calls the public API with a value exactly at the
limit, which must be accepted, and one step past it, which must be refused
with the documented code while the store stays exactly as it was; clamps
and the ledger sanitiser's bounds must cut exactly where documented. The
table and the checks must name the same limits. The negative control runs
the same checker against a payload limit raised by one byte and against a
refusal that writes before it raises: both must be reported.
"""

from __future__ import annotations

import random
import re
import secrets
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import reliability
from langgraph.checkpoint.base import empty_checkpoint
from psycopg import sql
from wiring import Wired

from flowvault.adapters.langgraph import FlowvaultSaver
from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.application import (
    MAX_LOAD_BATCH,
    BatchLoad,
    BlobStore,
    Guard,
    StreamHeadBatch,
    UnitOfWork,
    chained_event,
    drop_unit,
)
from flowvault.application import _records as records_module
from flowvault.application._blobs import MAX_BLOB_BYTES
from flowvault.application._record_kinds import MAX_WITNESS_BYTES
from flowvault.application._records import MAX_LIST_LIMIT, MAX_PAYLOAD_BYTES
from flowvault.application.ports import MAX_HEAD_BATCH
from flowvault.application.testing import FrozenClock, make_event, make_upsert
from flowvault.composition import Runtime, Settings, bootstrap
from flowvault.domain import (
    FlowvaultError,
    PayloadTooLarge,
    Witness,
    WorkflowState,
    WorkOrder,
    content_hash,
)
from flowvault.domain._approvals import MAX_WITNESS_LOCATORS
from flowvault.domain._canonical import canonical_bytes, parse_json

LIMITS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "limits.md"
ROW_ID = re.compile(r"^\| `([a-z0-9-]+)` \|", re.MULTILINE)
INVALID = "INVALID_INPUT"
TOO_LARGE = "PAYLOAD_TOO_LARGE"
TRUNCATED = "[TRUNCATED]"
DEFINITION = "limits.def"
SECOND = timedelta(seconds=1)
MICROSECOND = timedelta(microseconds=1)


# -- the checker -----------------------------------------------------------------


@dataclass(frozen=True)
class Boundary:
    """One edge of a limit: the call at it, the call one step past it, and what past means.

    ``refused`` is the error code (or exception type) the call past the limit
    must raise; ``None`` marks a clamp or cut, whose ``beyond`` asserts the
    documented result itself.
    """

    label: str
    at_limit: Callable[[], object]
    beyond: Callable[[], object]
    refused: str | type[Exception] | None


RAW_QUERIES = (
    "SELECT namespace, key_digest, revision, written_at, labels, byte_length, payload_digest "
    "FROM records",
    "SELECT * FROM record_labels",
    "SELECT * FROM ledger_streams",
    "SELECT count(*), max(idx) FROM ledger_events",
)
"""Every row that says what a store holds, without the payload bytes its digest stands for."""


class Stores:
    """Reads a store whole, to tell whether a refused call wrote anything.

    On the disk backends it reads the tables themselves, a few queries
    whatever the store holds; on the memory backend, every record's metadata
    and every stream's head through the port.
    """

    def __init__(self, store: Any, admin: Any = None) -> None:
        self.store = store
        self._execute: Callable[[str], Any] | None = None
        self._closing: Callable[[], None] = lambda: None
        if isinstance(store, SQLiteSecureObjectStore):
            uri = Path(store.path).absolute().as_uri() + "?mode=ro"
            reader = sqlite3.connect(uri, uri=True)
            self._execute, self._closing = reader.execute, reader.close
        elif admin is not None:
            admin.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(store.schema)))
            self._execute, self._closing = admin.execute, admin.close

    def snapshot(self) -> object:
        """Return what the store holds: every row, or every record's metadata and stream head."""
        if self._execute is not None:
            return [sorted(self._execute(query).fetchall(), key=repr) for query in RAW_QUERIES]
        records = {}
        for namespace in sorted(self.store.namespace_counts()):
            cursor: str | None = None
            while True:
                page = self.store.list(namespace, cursor=cursor, limit=MAX_LIST_LIMIT)
                for meta in page.items:
                    records[(namespace, meta.key_digest)] = (
                        meta.header.model_dump(mode="json"),
                        dict(meta.labels),
                        meta.byte_length,
                        meta.payload_digest,
                    )
                if page.next_cursor is None:
                    break
                cursor = page.next_cursor
        names: list[str] = []
        while page_of_names := self.store.list_streams(after=names[-1] if names else None):
            names += page_of_names
        return records, {name: self.store.ledger_head(name) for name in names}

    def close(self) -> None:
        """Close the raw connection, if one was opened."""
        self._closing()


def _refusal_matches(expected: str | type[Exception], error: BaseException | None) -> bool:
    if isinstance(expected, str):
        return isinstance(error, FlowvaultError) and error.code == expected
    return isinstance(error, expected)


def _describe(error: BaseException | None) -> str:
    if error is None:
        return "no error"
    if isinstance(error, FlowvaultError):
        return error.code
    return type(error).__name__


def _call(action: Callable[[], object]) -> BaseException | None:
    try:
        action()
    except Exception as exc:  # any escape is an outcome the checker judges
        return exc
    return None


def check(stores: Stores, boundary: Boundary) -> list[str]:
    """Return what is wrong at ``boundary``: an empty list when the limit holds exactly."""
    problems = []
    error = _call(boundary.at_limit)
    if error is not None:
        problems.append(f"at the limit: refused with {_describe(error)} ({error})")
    if boundary.refused is None:
        error = _call(boundary.beyond)
        if error is not None:
            problems.append(f"past the limit: {_describe(error)} ({error})")
        return problems
    before = stores.snapshot()
    error = _call(boundary.beyond)
    if not _refusal_matches(boundary.refused, error):
        problems.append(f"past the limit: {_describe(error)}, wanted {boundary.refused}")
    if stores.snapshot() != before:
        problems.append("past the limit: the store changed")
    return problems


# -- the bench -------------------------------------------------------------------


@dataclass
class Bench:
    """The runtime over one backend's store, and fresh names for each subject."""

    wired: Wired
    tmp_path: Path
    request: pytest.FixtureRequest
    rng: random.Random
    serial: int = 0
    cleanups: list[Callable[[], None]] = field(default_factory=list)

    @property
    def runtime(self) -> Runtime:
        """The runtime under test."""
        return self.wired.runtime

    @property
    def clock(self) -> FrozenClock:
        """The clock the runtime reads."""
        return self.wired.clock

    @property
    def backend(self) -> str:
        """The adapter's name."""
        return self.wired.backend

    def fresh(self, prefix: str) -> str:
        """Return a name no earlier subject used."""
        self.serial += 1
        return f"{prefix}-{self.serial}"

    def filler(self, size: int) -> str:
        """Return ``size`` seeded characters."""
        return "".join(self.rng.choices("abcdefghij", k=size))

    def run(self) -> str:
        """Start a graph run of the shared definition; return its id."""
        runs = self.runtime.runs
        self.runtime.definitions.register_definition(DEFINITION, {"nodes": ["a", "b"]})
        run, _ = runs.start_run(DEFINITION, {"n": self.serial})
        return run.run_id

    def workflow(self) -> str:
        """Create a workflow in ``intake``; return its id."""
        order = WorkOrder(kind="limits.check", requester="a", idempotency_key=self.fresh("wo"))
        record, _ = self.runtime.workflows.create(order)
        return record.workflow_id

    def checkpointing(self, run_id: str, **changes: Any) -> Callable[[], Any]:
        """Return the call that checkpoints ``run_id`` at a fresh cursor, with ``changes``."""
        fields: dict[str, Any] = {
            "state": {"s": 1},
            "budgets": {"tokens": 1},
            "counters": {"steps": 1},
            "dependency_summary": {},
            "terminal_cursor": None,
            "event_cursor": 0,
        }
        cursor = {"node": self.fresh("node")}
        return lambda: self.runtime.checkpoints.create_checkpoint(
            run_id, cursor, **{**fields, **changes}
        )

    def checkpoint(self) -> Any:
        """Create a checkpoint of a fresh run."""
        return self.checkpointing(self.run())()

    def requesting(self, checkpoint: Any, **changes: Any) -> Callable[[], object]:
        """Return the call that requests an approval on ``checkpoint``, with ``changes``."""
        fields: dict[str, Any] = {
            "expected_state_digest": checkpoint.state_digest,
            "expected_budgets": checkpoint.budgets,
            "expected_counters": checkpoint.counters,
            "expected_dependency_digest": checkpoint.dependency_digest,
            "audience": self.fresh("audience"),
            "prompt_digest": content_hash("pay?"),
            "allowed_decisions": ["approve", "reject"],
            "expires_at": self.clock.now() + timedelta(hours=1),
        }
        return lambda: self.runtime.approvals.request_approval(
            checkpoint.checkpoint_id, **{**fields, **changes}
        )


def nest(depth: int, inner: object = 0) -> object:
    """Return ``inner`` inside ``depth`` lists."""
    value = inner
    for _ in range(depth):
        value = [value]
    return value


def _solve(measure: Callable[[int], int], target: int) -> int:
    """Return the padding whose sealed size is exactly ``target`` (size grows one per char)."""
    padding = target - measure(0)
    assert measure(padding) == target, "sealed size is not linear in the padding"
    return padding


def _expect(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(what)


# -- stored content ----------------------------------------------------------------


def record_payload(bench: Bench) -> list[Boundary]:
    """Return the edges of 1 MiB of sealed payload, through the repository and a service."""
    repo = bench.runtime.repository
    space = "limits.payload"

    def sealed(size: int) -> int:
        draft = repo.prepare(space, "probe", {"pad": "x" * size}, expected=Guard.ABSENT)
        return len(draft.payload)

    pad = _solve(sealed, MAX_PAYLOAD_BYTES)

    def write(size: int) -> None:
        written = repo.write(space, bench.fresh("p"), {"pad": "x" * size}, expected=Guard.ABSENT)
        _expect(written.byte_length == MAX_PAYLOAD_BYTES, "not written at the limit")

    state = bench.runtime.state(bench.fresh("payload"))
    state_pad = _solve(
        lambda size: len(state.to_write(WorkflowState(pad="x" * size), None).upserts[0].payload),
        MAX_PAYLOAD_BYTES,
    )

    def save(size: int) -> None:
        state.save(WorkflowState(pad="x" * size))

    return [
        Boundary("SealedRepository.write", lambda: write(pad), lambda: write(pad + 1), TOO_LARGE),
        Boundary(
            "StateRepository.save", lambda: save(state_pad), lambda: save(state_pad + 1), TOO_LARGE
        ),
    ]


def blob_size(bench: Bench) -> list[Boundary]:
    """Return the edges of a blob's 64 MiB, written whole as 65 chunks at the limit."""
    blobs = BlobStore(bench.runtime.repository)
    space = "limits.blobs"

    def write(size: int) -> None:
        key = bench.fresh("b")
        blobs.write(space, key, bytes(size))
        info = blobs.info(space, key)
        _expect(info is not None and (info.size, info.chunks) == (size, 65), "not written whole")

    return [
        Boundary(
            "BlobStore.write",
            lambda: write(MAX_BLOB_BYTES),
            lambda: write(MAX_BLOB_BYTES + 1),
            TOO_LARGE,
        )
    ]


def witness_content(bench: Bench) -> list[Boundary]:
    """Return the edges of 512 KiB of evidence content."""
    evidence = bench.runtime.evidence

    def capture(size: int, fill: bytes) -> None:
        witness = evidence.capture_witness(
            "https://example.org/a", fill * size, "text/plain", "web", bench.clock.now()
        )
        _expect(witness.size_bytes == size, "size not kept")

    return [
        Boundary(
            "capture_witness",
            lambda: capture(MAX_WITNESS_BYTES, b"w"),
            lambda: capture(MAX_WITNESS_BYTES + 1, b"v"),
            TOO_LARGE,
        )
    ]


def json_depth(_bench: Bench) -> list[Boundary]:
    """Return the edges of 64 levels of canonical JSON, encoding and parsing."""
    return [
        Boundary(
            "canonical_bytes",
            lambda: canonical_bytes(nest(64)),
            lambda: canonical_bytes(nest(65)),
            INVALID,
        ),
        Boundary(
            "parse_json",
            lambda: parse_json("[" * 64 + "]" * 64),
            lambda: parse_json("[" * 65 + "]" * 65),
            INVALID,
        ),
    ]


def _write(bench: Bench, document: object, **options: Any) -> Callable[[], object]:
    space = options.pop("namespace", "limits.docs")
    return lambda: bench.runtime.repository.write(
        space, bench.fresh("doc"), document, expected=Guard.ABSENT, **options
    )


def document_depth(bench: Bench) -> list[Boundary]:
    """Return the edges of 63 levels in a sealed document."""
    return [
        Boundary(
            "SealedRepository.write", _write(bench, nest(63)), _write(bench, nest(64)), INVALID
        )
    ]


def json_integer(bench: Bench) -> list[Boundary]:
    """Return the edges of the integers canonical JSON holds exactly."""
    top = 2**53 - 1
    return [
        Boundary("maximum", _write(bench, {"n": top}), _write(bench, {"n": top + 1}), INVALID),
        Boundary("minimum", _write(bench, {"n": -top}), _write(bench, {"n": -top - 1}), INVALID),
    ]


def namespace(bench: Bench) -> list[Boundary]:
    """Return the edges of a namespace's 1 to 128 characters."""
    return [
        Boundary(
            "longest",
            _write(bench, 1, namespace="n" * 128),
            _write(bench, 1, namespace="n" * 129),
            INVALID,
        ),
        Boundary(
            "shortest", _write(bench, 1, namespace="n"), _write(bench, 1, namespace=""), INVALID
        ),
    ]


def labels_per_record(bench: Bench) -> list[Boundary]:
    """Return the edges of 8 labels per record."""

    def labels(count: int) -> dict[str, int]:
        return {f"l{i}": i for i in range(count)}

    return [
        Boundary(
            "write", _write(bench, 1, labels=labels(8)), _write(bench, 1, labels=labels(9)), INVALID
        )
    ]


def tags_per_record(bench: Bench) -> list[Boundary]:
    """Return the edges of 32 tags per record, at the store port and through the repository."""
    store = bench.runtime.store

    def tags(count: int) -> frozenset[str]:
        return frozenset(f"sha256:{n:064x}" for n in range(count))

    def commit(count: int) -> None:
        upsert = make_upsert("limits.tags", bench.fresh("t"), tags=tags(count))
        store.commit(UnitOfWork(upserts=[upsert]))

    return [
        Boundary("store port", lambda: commit(32), lambda: commit(33), INVALID),
        Boundary(
            "SealedRepository",
            _write(bench, 1, tags=tags(32)),
            _write(bench, 1, tags=tags(33)),
            INVALID,
        ),
    ]


def label_name(bench: Bench) -> list[Boundary]:
    """Return the edges of a label name's 32 characters."""
    return [
        Boundary(
            "write",
            _write(bench, 1, labels={"a" * 32: 1}),
            _write(bench, 1, labels={"a" * 33: 1}),
            INVALID,
        )
    ]


def label_text(bench: Bench) -> list[Boundary]:
    """Return the edges of a text label's 256 characters."""
    return [
        Boundary(
            "write",
            _write(bench, 1, labels={"t": "x" * 256}),
            _write(bench, 1, labels={"t": "x" * 257}),
            INVALID,
        )
    ]


def label_integer(bench: Bench) -> list[Boundary]:
    """Return the edges of integer labels: 64-bit at the port, 53-bit once sealed."""
    store = bench.runtime.store
    port_top = 2**63 - 1
    sealed_top = 2**53 - 1

    def commit(value: int) -> None:
        store.commit(
            UnitOfWork(
                upserts=[make_upsert("limits.labels", bench.fresh("l"), labels={"n": value})]
            )
        )

    return [
        Boundary(
            "store port, maximum", lambda: commit(port_top), lambda: commit(port_top + 1), INVALID
        ),
        Boundary(
            "store port, minimum", lambda: commit(-port_top), lambda: commit(-port_top - 1), INVALID
        ),
        Boundary(
            "SealedRepository, maximum",
            _write(bench, 1, labels={"n": sealed_top}),
            _write(bench, 1, labels={"n": sealed_top + 1}),
            INVALID,
        ),
        Boundary(
            "SealedRepository, minimum",
            _write(bench, 1, labels={"n": -sealed_top}),
            _write(bench, 1, labels={"n": -sealed_top - 1}),
            INVALID,
        ),
    ]


# -- names and identifiers -------------------------------------------------------------


def scope(bench: Bench) -> list[Boundary]:
    """Return the edges of a scope name's 1 to 64 characters."""

    def save(name: str) -> None:
        bench.runtime.state(name).save(WorkflowState(step=1))

    return [
        Boundary("longest", lambda: save("s" * 64), lambda: save("s" * 65), INVALID),
        Boundary("shortest", lambda: save("s"), lambda: save(""), INVALID),
    ]


def run_id(bench: Bench) -> list[Boundary]:
    """Return the edges of a run id's 3 to 128 characters.

    Checked where a run id is read, as a checkpoint now needs a started run.
    """

    def create(name: str) -> None:
        bench.runtime.checkpoints.latest_checkpoint(name)

    return [
        Boundary("longest", lambda: create("r" * 128), lambda: create("r" * 129), INVALID),
        Boundary("shortest", lambda: create("rrr"), lambda: create("rr"), INVALID),
    ]


def definition_id(bench: Bench) -> list[Boundary]:
    """Return the edges of a definition id's 1 to 64 characters."""

    def register(name: str) -> None:
        bench.runtime.definitions.register_definition(name, {"nodes": [name]})

    return [
        Boundary("longest", lambda: register("d" * 64), lambda: register("d" * 65), INVALID),
        Boundary("shortest", lambda: register("d"), lambda: register(""), INVALID),
    ]


def run_idempotency_key(bench: Bench) -> list[Boundary]:
    """Return the edges of a run request's 1 to 256 character idempotency key."""
    runs = bench.runtime.runs
    bench.runtime.definitions.register_definition(DEFINITION, {"nodes": ["a", "b"]})

    def start(key: str) -> None:
        runs.start_run(DEFINITION, {"key": len(key)}, idempotency_key=key)

    return [
        Boundary("longest", lambda: start("k" * 256), lambda: start("k" * 257), INVALID),
        Boundary("shortest", lambda: start("k"), lambda: start(""), INVALID),
    ]


def request_idempotency_key(bench: Bench) -> list[Boundary]:
    """Return the edges of a remembered request's 1 to 256 character key."""

    def remember(key: str) -> None:
        bench.runtime.idempotency.remember(key, {"q": len(key)}, {"a": 1})

    return [
        Boundary("longest", lambda: remember("k" * 256), lambda: remember("k" * 257), INVALID),
        Boundary("shortest", lambda: remember("k"), lambda: remember(""), INVALID),
    ]


def event_type(bench: Bench) -> list[Boundary]:
    """Return the edges of an event type's 100 characters."""
    run = bench.run()

    def append(kind: str) -> None:
        bench.runtime.runs.append_run_events(run, [(kind, {})])

    return [
        Boundary("append_run_events", lambda: append("e" * 100), lambda: append("e" * 101), INVALID)
    ]


def events_per_call(bench: Bench) -> list[Boundary]:
    """Return the edges of 200 caller events per call."""
    run = bench.run()

    def append(count: int) -> None:
        appended = bench.runtime.runs.append_run_events(run, [("step.done", {})] * count)
        _expect(len(appended) == count, "events lost")

    return [Boundary("append_run_events", lambda: append(200), lambda: append(201), INVALID)]


def drops_per_unit(bench: Bench) -> list[Boundary]:
    """Return the edges of 200 streams dropped by one ``drop_unit``."""
    runtime, now = bench.runtime, bench.clock.now()
    sets = {count: [f"{bench.fresh('dropped')}/{n}" for n in range(count)] for count in (200, 201)}
    events = [
        chained_event(runtime.repository, name, "step.done", None, now, after=None)
        for names in sets.values()
        for name in names
    ]
    runtime.store.commit(UnitOfWork(appends=events))

    def drop(count: int) -> None:
        unit = drop_unit(
            runtime.store, runtime.repository, *sets[count], occurred_at=now, reason="limits"
        )
        runtime.store.commit(unit)
        _expect(all(runtime.store.ledger_head(name) is None for name in sets[count]), "kept")

    return [Boundary("drop_unit", lambda: drop(200), lambda: drop(201), INVALID)]


def _saver(bench: Bench) -> FlowvaultSaver:
    return FlowvaultSaver.from_runtime(bench.runtime)


def _lg_checkpoint(cid: str | None = None, version: str | int = 1) -> Any:
    checkpoint = empty_checkpoint()
    if cid is not None:
        checkpoint["id"] = cid
    checkpoint["channel_values"] = {"v": 1}
    checkpoint["channel_versions"] = {"v": version}
    return checkpoint


def langgraph_checkpoint_id(bench: Bench) -> list[Boundary]:
    """Return the edges of a checkpoint id's 100 characters."""
    saver = _saver(bench)

    def put(length: int) -> None:
        config = {"configurable": {"thread_id": bench.fresh("lg"), "checkpoint_ns": ""}}
        saver.put(config, _lg_checkpoint("c" * length), {}, {"v": 1})

    return [Boundary("put", lambda: put(100), lambda: put(101), INVALID)]


def langgraph_channel_version(bench: Bench) -> list[Boundary]:
    """Return the edges of a text channel version's 128 characters."""
    saver = _saver(bench)

    def put(length: int) -> None:
        config = {"configurable": {"thread_id": bench.fresh("lg"), "checkpoint_ns": ""}}
        version = "9" * length
        saver.put(config, _lg_checkpoint(version=version), {}, {"v": version})

    return [Boundary("put", lambda: put(128), lambda: put(129), INVALID)]


def langgraph_prune_namespaces(bench: Bench) -> list[Boundary]:
    """Return the edges of 100 namespaces kept by one prune."""
    saver = _saver(bench)

    def thread(namespaces: int) -> str:
        thread_id = bench.fresh("lg")
        for ns in range(namespaces):
            config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": f"n{ns}"}}
            for _ in range(2):
                config = saver.put(config, _lg_checkpoint(), {}, {"v": 1})
        return thread_id

    at_limit, beyond = thread(100), thread(101)
    return [
        Boundary(
            "prune",
            lambda: saver.prune([at_limit]),
            lambda: saver.prune([beyond]),
            INVALID,
        )
    ]


def actor(bench: Bench) -> list[Boundary]:
    """Return the edges of a decider's 1 to 256 characters."""
    first, second = (bench.requesting(bench.checkpoint())() for _ in range(2))

    def decide(approval: Any, name: str) -> Callable[[], object]:
        return lambda: bench.runtime.approvals.decide(approval.approval_id, "approve", name)

    return [Boundary("decide", decide(first, "a" * 256), decide(second, "a" * 257), INVALID)]


def audience(bench: Bench) -> list[Boundary]:
    """Return the edges of an audience's 256 characters."""
    checkpoint = bench.checkpoint()
    return [
        Boundary(
            "request_approval",
            bench.requesting(checkpoint, audience="a" * 256),
            bench.requesting(checkpoint, audience="a" * 257),
            INVALID,
        )
    ]


def allowed_decisions(bench: Bench) -> list[Boundary]:
    """Return the edges of an approval's 1 to 16 allowed decisions."""
    checkpoint = bench.checkpoint()

    def decisions(count: int) -> Callable[[], object]:
        return bench.requesting(checkpoint, allowed_decisions=[f"choice{i}" for i in range(count)])

    return [
        Boundary("longest", decisions(16), decisions(17), INVALID),
        Boundary("shortest", decisions(1), decisions(0), INVALID),
    ]


def quorum_deciders(bench: Bench) -> list[Boundary]:
    """Return the edges of a quorum approval's 64 named deciders and its 1 to 64 required."""
    checkpoint = bench.checkpoint()

    def deciders(count: int, required: int = 2) -> Callable[[], object]:
        names = [f"decider{i}@example.org" for i in range(count)]
        return bench.requesting(checkpoint, deciders=names, required=required)

    return [
        Boundary("deciders", deciders(64), deciders(65), INVALID),
        Boundary("required", deciders(64, required=64), deciders(64, required=65), INVALID),
        Boundary("required-minimum", deciders(3, required=1), deciders(3, required=0), INVALID),
    ]


def budget_entries(bench: Bench) -> list[Boundary]:
    """Return the edges of a checkpoint's 64 budget and counter entries."""
    run = bench.run()

    def entries(count: int) -> dict[str, int]:
        return {f"b{i}": i for i in range(count)}

    return [
        Boundary(
            "budgets",
            bench.checkpointing(run, budgets=entries(64)),
            bench.checkpointing(run, budgets=entries(65)),
            INVALID,
        ),
        Boundary(
            "counters",
            bench.checkpointing(run, counters=entries(64)),
            bench.checkpointing(run, counters=entries(65)),
            INVALID,
        ),
    ]


def locator(bench: Bench) -> list[Boundary]:
    """Return the edges of an evidence locator's 1 to 2,048 characters."""

    def capture(size: int) -> None:
        bench.runtime.evidence.capture_witness(
            "h" * size, bench.fresh("body").encode(), "text/plain", "web", bench.clock.now()
        )

    return [
        Boundary("longest", lambda: capture(2048), lambda: capture(2049), INVALID),
        Boundary("shortest", lambda: capture(1), lambda: capture(0), INVALID),
    ]


def witness_locators(bench: Bench) -> list[Boundary]:
    """Return the edges of the 16 locators one witness records."""
    content = bench.fresh("mirrored").encode()

    def capture(number: int) -> Witness:
        return bench.runtime.evidence.capture_witness(
            f"https://m{number}.example.org/", content, "text/plain", "web", bench.clock.now()
        )

    def fill() -> None:
        kept = [capture(number) for number in range(MAX_WITNESS_LOCATORS)][-1]
        _expect(len(kept.locators) == MAX_WITNESS_LOCATORS, "a locator was not kept")

    return [
        Boundary("locators", fill, lambda: capture(MAX_WITNESS_LOCATORS), INVALID),
    ]


def stop_reason(bench: Bench) -> list[Boundary]:
    """Return the edges of a stop reason's 200 characters."""

    def stop(size: int) -> Callable[[], object]:
        workflow = bench.workflow()
        return lambda: bench.runtime.workflows.transition(
            workflow, "stopped", expected_state="intake", expected_version=1, stop_reason="s" * size
        )

    return [Boundary("transition", stop(200), stop(201), INVALID)]


def work_order_fields(bench: Bench) -> list[Boundary]:
    """Return the edges of a work order's fields, refused as ``INVALID_INPUT`` when it is built."""
    base: dict[str, Any] = {"kind": "k", "requester": "r", "idempotency_key": "i"}

    def order(**changes: Any) -> Callable[[], object]:
        return lambda: WorkOrder(**{**base, **changes})

    def create_at_limits() -> None:
        made = WorkOrder(
            kind="k" * 64, requester="r" * 200, idempotency_key="i" * 256, priority=100
        )
        _, created = bench.runtime.workflows.create(made)
        _expect(created, "not created")

    return [
        Boundary("all at their limits", create_at_limits, order(kind="k" * 65), INVALID),
        Boundary("kind", order(kind="k" * 64), order(kind="k" * 65), INVALID),
        Boundary("requester", order(requester="r" * 200), order(requester="r" * 201), INVALID),
        Boundary(
            "idempotency key",
            order(idempotency_key="i" * 256),
            order(idempotency_key="i" * 257),
            INVALID,
        ),
        Boundary("priority, highest", order(priority=100), order(priority=101), INVALID),
        Boundary("priority, lowest", order(priority=-100), order(priority=-101), INVALID),
    ]


# -- reads and retention ------------------------------------------------------------


def _page_of(size: int, read: Callable[[int], int]) -> Callable[[], object]:
    """Read a page asking for ``size``; it must hold exactly the clamped count."""

    def check_page() -> None:
        got = read(size)
        _expect(got == min(size, MAX_LIST_LIMIT), f"asked {size}, got {got}")

    return check_page


def page_size(bench: Bench) -> list[Boundary]:
    """Return the edges of a page: 200 items at most, clamped above, refused below 1."""
    runtime, store = bench.runtime, bench.runtime.store
    count = MAX_LIST_LIMIT + 1
    space = "limits.pages"
    drafts = [
        runtime.repository.prepare(space, f"r{i}", {"i": i}, expected=Guard.ABSENT)
        for i in range(count)
    ]
    store.commit(UnitOfWork(upserts=drafts))
    stream = "limits/long"
    events = [make_event(stream, 0)]
    for index in range(1, count):
        events.append(make_event(stream, index, events[-1]))
    store.commit(
        UnitOfWork(appends=events + [make_event(f"limits/s{i:03d}", 0) for i in range(count)])
    )
    run = bench.run()
    runtime.runs.append_run_events(run, [("step.done", {})] * MAX_LIST_LIMIT)
    for _ in range(count):
        bench.workflow()
    readers: dict[str, Callable[[int], int]] = {
        "list": lambda n: len(store.list(space, limit=n).items),
        "read_ledger": lambda n: len(store.read_ledger(stream, limit=n).events),
        "list_streams": lambda n: len(store.list_streams(limit=n)),
        "read_run_events": lambda n: len(runtime.runs.read_run_events(run, limit=n).events),
        "list_workflows": lambda n: len(runtime.workflows.list_workflows(limit=n).items),
    }
    boundaries = []
    for name, read in readers.items():
        boundaries.append(
            Boundary(f"{name} clamps", _page_of(MAX_LIST_LIMIT, read), _page_of(count, read), None)
        )
        boundaries.append(
            Boundary(f"{name} below 1", _page_of(1, read), lambda read=read: read(0), INVALID)
        )
    return boundaries


def action_result_retention(bench: Bench) -> list[Boundary]:
    """Return the edges of an action result's 1 second to 30 days."""
    workflow = bench.workflow()

    def keep(for_: timedelta) -> None:
        action = content_hash(bench.fresh("action"))
        bench.runtime.action_results.put_action_result(
            workflow, action, {"ok": True}, retention=for_
        )

    longest, shortest = timedelta(days=30), SECOND
    return [
        Boundary("longest", lambda: keep(longest), lambda: keep(longest + MICROSECOND), INVALID),
        Boundary("shortest", lambda: keep(shortest), lambda: keep(shortest - MICROSECOND), INVALID),
    ]


# -- ledger payloads -----------------------------------------------------------------


def _logged(bench: Bench, run: str, payload: dict[str, Any]) -> object:
    """Append ``payload`` as a run event; return it as stored, after checking the read-back."""
    event = bench.runtime.runs.append_run_events(run, [("ledger.probe", payload)])[0]
    stored = bench.runtime.runs.read_run_events(run, cursor=event.index, limit=1).events[0]
    _expect(stored == event, "the stored event differs from the appended one")
    return stored.payload


def _logs_as(
    bench: Bench, run: str, payload: dict[str, Any], expected: object
) -> Callable[[], object]:
    def append() -> None:
        _expect(_logged(bench, run, payload) == expected, "payload not cut as documented")

    return append


def ledger_string(bench: Bench) -> list[Boundary]:
    """Return the edges of a ledger string's or key's 1,024 characters."""
    run = bench.run()
    text = bench.filler(1025)
    cut = {"s": text[:1024] + "…[TRUNCATED]"}
    return [
        Boundary(
            "string",
            _logs_as(bench, run, {"s": text[:1024]}, {"s": text[:1024]}),
            _logs_as(bench, run, {"s": text}, cut),
            None,
        ),
        Boundary(
            "key",
            _logs_as(bench, run, {text[:1024]: 1}, {text[:1024]: 1}),
            _logs_as(bench, run, {text: 1}, {text[:1024] + "…[TRUNCATED]": 1}),
            None,
        ),
    ]


def ledger_items(bench: Bench) -> list[Boundary]:
    """Return the edges of 100 items per ledger list and entries per mapping."""
    run = bench.run()
    items = list(range(101))
    entries = {f"k{i:03d}": i for i in range(101)}
    kept = {f"k{i:03d}": i for i in range(100)}
    return [
        Boundary(
            "list",
            _logs_as(bench, run, {"l": items[:100]}, {"l": items[:100]}),
            _logs_as(bench, run, {"l": items}, {"l": [*items[:100], TRUNCATED]}),
            None,
        ),
        Boundary(
            "mapping", _logs_as(bench, run, kept, kept), _logs_as(bench, run, entries, kept), None
        ),
    ]


def ledger_depth(bench: Bench) -> list[Boundary]:
    """Return the edges of 8 levels of ledger containers."""
    run = bench.run()
    return [
        Boundary(
            "containers",
            _logs_as(bench, run, {"d": nest(7)}, {"d": nest(7)}),
            _logs_as(bench, run, {"d": nest(8)}, {"d": nest(7, TRUNCATED)}),
            None,
        )
    ]


def ledger_bytes(bench: Bench) -> list[Boundary]:
    """Return the edges of 16 KiB of canonical ledger payload."""
    run = bench.run()
    limit = 16 * 1024
    payload = {f"k{i:02d}": bench.filler(1000) for i in range(16)}
    payload["k16"] = ""
    payload["k16"] = bench.filler(limit - len(canonical_bytes(payload)))
    _expect(len(canonical_bytes(payload)) == limit, "the probe is not 16 KiB")
    over = {**payload, "k16": payload["k16"] + "x"}
    summary = {"truncated": True, "bytes": limit + 1, "digest": content_hash(over)}
    return [
        Boundary(
            "canonical size",
            _logs_as(bench, run, payload, payload),
            _logs_as(bench, run, over, summary),
            None,
        )
    ]


# -- settings ----------------------------------------------------------------------


def master_key(bench: Bench) -> list[Boundary]:
    """Return the edges of the 32-byte master key."""

    def open_with(key: bytes) -> None:
        bootstrap(
            Settings(backend="memory", home=bench.tmp_path / "home"),
            key=key,
            store=bench.runtime.store,
        )

    key = bench.wired.key
    return [
        Boundary(
            "one byte more", lambda: open_with(key), lambda: open_with(key + b"\x00"), INVALID
        ),
        Boundary("one byte less", lambda: open_with(key), lambda: open_with(key[:31]), INVALID),
    ]


def _settings(name: str, value: str) -> Callable[[], object]:
    return lambda: Settings.from_env({f"FLOWVAULT_{name}": value, "FLOWVAULT_HOME": "/nonexistent"})


def timeouts(_bench: Bench) -> list[Boundary]:
    """Return the edges of every timeout setting's 3,600 seconds."""
    boundaries = []
    names = (
        "BUSY_TIMEOUT",
        "POSTGRES_STATEMENT_TIMEOUT",
        "POSTGRES_LOCK_TIMEOUT",
        "POSTGRES_CONNECT_TIMEOUT",
    )
    for name in names:
        boundaries += [
            Boundary(
                f"{name} longest", _settings(name, "3600"), _settings(name, "3600.001"), INVALID
            ),
            Boundary(f"{name} shortest", _settings(name, "0.001"), _settings(name, "0"), INVALID),
        ]
    return boundaries


def head_batch(bench: Bench) -> list[Boundary]:
    """Return the edge of one batch of stream heads: 500 names at most."""
    store = bench.runtime.store
    if not isinstance(store, StreamHeadBatch):
        return []
    names = [f"limits/heads{i:03d}" for i in range(MAX_HEAD_BATCH + 1)]
    return [
        Boundary(
            "ledger_head_indexes",
            lambda: store.ledger_head_indexes(names[:MAX_HEAD_BATCH]),
            lambda: store.ledger_head_indexes(names),
            INVALID,
        )
    ]


def load_batch(bench: Bench) -> list[Boundary]:
    """Return the edge of one batch of record loads: 200 key digests at most."""
    store = bench.runtime.store
    if not isinstance(store, BatchLoad):
        return []
    names = [f"sha256:{i:064x}" for i in range(MAX_LOAD_BATCH + 1)]
    return [
        Boundary(
            "load_many",
            lambda: store.load_many("limits/batch", names[:MAX_LOAD_BATCH]),
            lambda: store.load_many("limits/batch", names),
            INVALID,
        )
    ]


def pool_size(bench: Bench) -> list[Boundary]:
    """Return the edges of 1 to 100 pooled connections."""
    name = "POSTGRES_POOL_SIZE"
    boundaries = [
        Boundary("settings, largest", _settings(name, "100"), _settings(name, "101"), INVALID),
        Boundary("settings, smallest", _settings(name, "1"), _settings(name, "0"), INVALID),
    ]
    if bench.backend == "postgres":
        boundaries += [
            Boundary(
                "open refuses 101; 100 is accepted by the settings (a pool that size would "
                "exceed the test server's max_connections)",
                _settings(name, "100"),
                lambda: _open_pg(bench, pool_size=101),
                INVALID,
            ),
            Boundary(
                "open, smallest",
                lambda: _open_pg(bench, pool_size=1),
                lambda: _open_pg(bench, pool_size=0),
                INVALID,
            ),
        ]
    return boundaries


def postgres_schema(bench: Bench) -> list[Boundary]:
    """Return the edges of a PostgreSQL schema name's 63 characters."""
    name = "POSTGRES_SCHEMA"
    longest = ("fvtest_" + secrets.token_hex(32))[:63]
    boundaries = [
        Boundary("settings", _settings(name, longest), _settings(name, longest + "x"), INVALID),
    ]
    if bench.backend == "postgres":
        boundaries.append(
            Boundary(
                "open",
                lambda: _open_pg(bench, schema=longest),
                lambda: _open_pg(bench, schema=longest + "x"),
                INVALID,
            )
        )
    return boundaries


def _open_pg(bench: Bench, **options: Any) -> None:
    """Open (and close) a second store on the test server; drop a schema it created."""
    from flowvault.adapters.postgres import PostgresSecureObjectStore  # noqa: PLC0415

    server = bench.request.getfixturevalue("postgres_server")
    schema = options.pop("schema", bench.runtime.store.schema)
    store = PostgresSecureObjectStore.open(server.dsn, schema=schema, create=True, **options)
    store.close()
    if schema != bench.runtime.store.schema:
        bench.cleanups.append(lambda: server.drop_schema(schema))


CASES: dict[str, Callable[[Bench], list[Boundary]]] = {
    "record-payload": record_payload,
    "blob-size": blob_size,
    "witness-content": witness_content,
    "json-depth": json_depth,
    "document-depth": document_depth,
    "json-integer": json_integer,
    "namespace": namespace,
    "labels-per-record": labels_per_record,
    "tags-per-record": tags_per_record,
    "label-name": label_name,
    "label-text": label_text,
    "label-integer": label_integer,
    "scope": scope,
    "run-id": run_id,
    "definition-id": definition_id,
    "run-idempotency-key": run_idempotency_key,
    "request-idempotency-key": request_idempotency_key,
    "event-type": event_type,
    "events-per-call": events_per_call,
    "drops-per-unit": drops_per_unit,
    "actor": actor,
    "audience": audience,
    "allowed-decisions": allowed_decisions,
    "quorum-deciders": quorum_deciders,
    "budget-entries": budget_entries,
    "locator": locator,
    "witness-locators": witness_locators,
    "stop-reason": stop_reason,
    "work-order-fields": work_order_fields,
    "action-result-retention": action_result_retention,
    "ledger-string": ledger_string,
    "ledger-items": ledger_items,
    "ledger-depth": ledger_depth,
    "ledger-bytes": ledger_bytes,
    "master-key": master_key,
    "timeouts": timeouts,
    "pool-size": pool_size,
    "postgres-schema": postgres_schema,
    "head-batch": head_batch,
    "load-batch": load_batch,
    "langgraph-checkpoint-id": langgraph_checkpoint_id,
    "langgraph-channel-version": langgraph_channel_version,
    "langgraph-prune-namespaces": langgraph_prune_namespaces,
    "page-size": page_size,
}
"""Every row of ``docs/limits.md``; ``page-size`` last, since it fills the store."""


# -- the negative control --------------------------------------------------------------


def _controls(bench: Bench, stores: Stores) -> list[bool]:
    """Run the checker on two broken variants; return, for each, whether it was reported."""
    caught = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(records_module, "MAX_PAYLOAD_BYTES", MAX_PAYLOAD_BYTES + 1)
        caught.append(bool(check(stores, record_payload(bench)[0])))
    repo = bench.runtime.repository

    def writes_then_refuses() -> None:
        repo.write("limits.control", bench.fresh("c"), {"pad": 1}, expected=Guard.ABSENT)
        raise PayloadTooLarge("refused after the write")

    leaky = Boundary("leaky refusal", lambda: None, writes_then_refuses, TOO_LARGE)
    caught.append(bool(check(stores, leaky)))
    return caught


def documented_limits() -> list[str]:
    """Return the ids of the rows of the limits page, in order."""
    return ROW_ID.findall(LIMITS_PAGE.read_text(encoding="utf-8"))


# -- the family -------------------------------------------------------------------------


def test_every_documented_limit_holds_exactly(
    wired: Wired, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Each documented limit accepts a value at the limit and refuses one past it, writing nothing.

    Refusals carry the documented code; clamps and ledger cuts happen exactly
    at the documented size. The limits page and these checks name the same
    limits, and the checker reports both broken variants of the control.
    """
    seed = reliability.seed_base()
    watch = reliability.Stopwatch()
    backend = wired.backend
    bench = Bench(wired, tmp_path, request, random.Random(seed))
    documented = documented_limits()
    anomalies = [f"documented but not checked: {name}" for name in documented if name not in CASES]
    anomalies += [f"checked but not documented: {name}" for name in CASES if name not in documented]
    admin = request.getfixturevalue("postgres_server").admin() if backend == "postgres" else None
    stores = Stores(wired.runtime.store, admin)
    boundaries = 0
    try:
        caught = _controls(bench, stores)
        for name, case in CASES.items():
            for boundary in case(bench):
                boundaries += 1
                found = check(stores, boundary)
                anomalies += [
                    f"seed={seed} {backend} {name} ({boundary.label}): {p}" for p in found
                ]
    finally:
        stores.close()
        for cleanup in bench.cleanups:
            cleanup()
    figure = reliability.record(
        reliability.Figure(
            family=f"Size limits at limit+1 ({wired.family})",
            trials=2 * boundaries,
            anomalies=len(anomalies),
            control_caught=all(caught),
            detail=(
                f"{len(CASES)} documented limits, {boundaries} boundaries, each called "
                f"at and one past the limit; control caught {sum(caught)}/{len(caught)}"
            ),
            seconds=watch.seconds,
        )
    )
    assert not anomalies, "\n".join(anomalies)
    assert figure.control_caught, f"the checker missed a broken variant: {caught}"
