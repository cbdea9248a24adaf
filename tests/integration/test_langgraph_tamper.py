"""Edits to a LangGraph thread's rows, made in the database without the key.

Each edit is made in SQL on a real SQLite file or PostgreSQL schema, as
someone with write access to the database (but not the key) could. The
saver must refuse every one with a typed error; the same edits are made
against LangGraph's ``SqliteSaver`` with its ``EncryptedSerializer`` and
what it accepts is recorded, and the table in docs/langgraph.md must say
exactly that.
"""

from __future__ import annotations

import re
import secrets
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import Checkpoint, CheckpointTuple, empty_checkpoint
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.sqlite import SqliteSaver

from flowvault.adapters.langgraph import FlowvaultSaver
from flowvault.composition import Settings, bootstrap
from flowvault.domain import IntegrityFailure, StoreRolledBack

KEY = secrets.token_bytes(32)
DOCS = Path(__file__).resolve().parents[2] / "docs" / "langgraph.md"

EDITS = (
    "an unencrypted row forged in place of a checkpoint",
    "a checkpoint's ciphertext pasted from another thread",
    "the newest checkpoint deleted",
    "an older checkpoint deleted",
    "a checkpoint's pending writes deleted",
    "the pending writes put back as an older copy",
    "the whole tail of the thread cut",
)


def _checkpoint(step: int, value: str) -> tuple[Checkpoint, dict[str, Any]]:
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"notes": value}
    checkpoint["channel_versions"] = {"notes": step + 1}
    return checkpoint, {"source": "loop", "step": step, "owner": "canary@example.com"}


def _config(thread: str, cid: str | None = None) -> dict[str, Any]:
    configurable: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
    if cid is not None:
        configurable["checkpoint_id"] = cid
    return {"configurable": configurable}


@dataclass
class Thread:
    """What the scenario wrote: the checkpoint ids of thread A, oldest first."""

    ids: list[str]


def _populate(saver: Any) -> Thread:
    """Write three checkpoints to thread A (writes on the last two) and one to thread B."""
    ids = []
    parent: dict[str, Any] = _config("thread-a")
    for step in range(3):
        checkpoint, metadata = _checkpoint(step, f"a-{step}")
        parent = saver.put(parent, checkpoint, metadata, {"notes": step + 1})
        ids.append(checkpoint["id"])
        if step >= 1:
            saver.put_writes(parent, [("notes", f"pending-{step}")], task_id=f"task-{step}")
    checkpoint, metadata = _checkpoint(0, "b-0")
    saver.put(_config("thread-b"), checkpoint, metadata, {"notes": 1})
    return Thread(ids)


def _read_everything(saver: Any, thread: Thread) -> list[CheckpointTuple | None]:
    """Read what a resumed graph and a history view read: the newest, each by id, the listing."""
    found: list[CheckpointTuple | None] = [saver.get_tuple(_config("thread-a"))]
    found.extend(saver.get_tuple(_config("thread-a", cid)) for cid in thread.ids)
    found.extend(saver.list(_config("thread-a")))
    return found


class Sql:
    """One connection to the database under a store, with SQLite's placeholders on both."""

    def __init__(self, execute: Callable[[str, tuple[Any, ...]], list[tuple[Any, ...]]]) -> None:
        self._execute = execute

    def __call__(self, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        return self._execute(statement, params)


@contextmanager
def _sqlite(path: Path) -> Iterator[Sql]:
    connection = sqlite3.connect(path, isolation_level=None)
    try:

        def execute(statement: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
            return connection.execute(statement, params).fetchall()

        yield Sql(execute)
    finally:
        connection.close()


@contextmanager
def _postgres(dsn: str, schema: str) -> Iterator[Sql]:
    import psycopg  # noqa: PLC0415 - the postgres extra
    from psycopg.types.json import Jsonb  # noqa: PLC0415

    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(f"SET search_path TO {schema}")

        def execute(statement: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
            adapted = tuple(Jsonb(value) if isinstance(value, dict) else value for value in params)
            cursor = connection.execute(statement.replace("?", "%s"), adapted)  # type: ignore[arg-type]
            return cursor.fetchall() if cursor.description else []

        yield Sql(execute)


# -- flowvault -----------------------------------------------------------------

RECORD_COLUMNS = (
    "revision, sensitivity, schema_version, key_id, written_at, labels, "
    "byte_length, payload_digest, payload, ledger_index"
)


class FlowvaultTarget:
    """A flowvault store behind a runtime that keeps its high-water mark, and SQL beside it."""

    def __init__(self, settings: Settings, sql: Callable[[], Any]) -> None:
        self.settings = settings
        self.sql = sql

    @contextmanager
    def saver(self) -> Iterator[FlowvaultSaver]:
        with bootstrap(self.settings, key=KEY, create=True) as runtime:
            yield FlowvaultSaver.from_runtime(runtime)

    def digests(self, saver: FlowvaultSaver, thread: str, cid: str) -> tuple[str, str]:
        rows = saver._rows
        named = rows.thread(thread)
        return rows.checkpoint_digest(named, "", cid), rows.writes_digest(named, "", cid)


def _row(sql: Sql, digest: str) -> tuple[Any, ...]:
    found = sql(f"SELECT {RECORD_COLUMNS} FROM records WHERE key_digest = ?", digest)  # noqa: S608 - fixed column names
    assert len(found) == 1
    return found[0]


def _set_row(sql: Sql, digest: str, values: tuple[Any, ...]) -> None:
    assignments = ", ".join(f"{column.strip()} = ?" for column in RECORD_COLUMNS.split(","))
    sql(f"UPDATE records SET {assignments} WHERE key_digest = ?", *values, digest)  # noqa: S608 - fixed column names


def _flowvault_edit(target: FlowvaultTarget, edit: str) -> None:
    """Make ``edit`` and check every read of the thread refuses it."""
    with target.saver() as saver:
        thread = _populate(saver)
        newest, newest_writes = target.digests(saver, "thread-a", thread.ids[-1])
        oldest, _ = target.digests(saver, "thread-a", thread.ids[0])
        other, _ = target.digests(
            saver,
            "thread-b",
            saver.get_tuple(_config("thread-b")).config["configurable"]["checkpoint_id"],
        )  # type: ignore[union-attr]
        stream = saver._rows.thread("thread-a").stream
        with target.sql() as sql:
            older_writes = _row(sql, newest_writes)
        saver.put_writes(
            _config("thread-a", thread.ids[-1]), [("notes", "later")], task_id="task-later"
        )
    with target.sql() as sql:
        if edit == EDITS[0]:
            forged = b'{"v":1,"labels":{},"document":{"forged":true}}'
            values = list(_row(sql, newest))
            values[6], values[8] = len(forged), forged
            _set_row(sql, newest, tuple(values))
        elif edit == EDITS[1]:
            pasted = list(_row(sql, other))
            pasted[5] = _row(sql, newest)[5]
            _set_row(sql, newest, tuple(pasted))
        elif edit == EDITS[2]:
            sql("DELETE FROM records WHERE key_digest = ?", newest)
        elif edit == EDITS[3]:
            sql("DELETE FROM records WHERE key_digest = ?", oldest)
        elif edit == EDITS[4]:
            sql("DELETE FROM records WHERE key_digest = ?", newest_writes)
        elif edit == EDITS[5]:
            _set_row(sql, newest_writes, older_writes)
        else:
            head = sql("SELECT ledger_index FROM records WHERE key_digest = ?", newest)[0][0]
            sql("DELETE FROM records WHERE key_digest IN (?, ?)", newest, newest_writes)
            sql("DELETE FROM ledger_events WHERE stream = ? AND idx >= ?", stream, head)
            last = sql(
                "SELECT event_hash FROM ledger_events WHERE stream = ? AND idx = ?",
                stream,
                head - 1,
            )
            sql(
                "UPDATE ledger_streams SET head_index = ?, head_hash = ? WHERE stream = ?",
                head - 1,
                last[0][0],
                stream,
            )
    if edit == EDITS[6]:
        with pytest.raises(StoreRolledBack):
            bootstrap(target.settings, key=KEY)
        return
    with target.saver() as saver:
        with pytest.raises(IntegrityFailure) as listing:
            list(saver.list(_config("thread-a")))
        _names_nothing_in_clear(listing.value)
        named = thread.ids[0] if edit == EDITS[3] else None
        with pytest.raises(IntegrityFailure) as read:
            saver.get_tuple(_config("thread-a", named))
        _names_nothing_in_clear(read.value)


def _names_nothing_in_clear(refused: IntegrityFailure) -> None:
    said = f"{refused} {refused!r} {refused.details!r}"
    assert "thread-a" not in said
    assert "canary" not in said


@pytest.mark.parametrize("edit", EDITS)
def test_flowvault_on_sqlite_refuses(edit: str, tmp_path: Path) -> None:
    """Each edit to a SQLite file is refused by the listing and by a read of what it touched."""
    settings = Settings(backend="sqlite", home=tmp_path / "home", mark_sync="strict")
    target = FlowvaultTarget(settings, lambda: _sqlite(settings.database_path))
    _flowvault_edit(target, edit)


@pytest.mark.postgres
@pytest.mark.parametrize("edit", EDITS)
def test_flowvault_on_postgres_refuses(
    edit: str, tmp_path: Path, postgres_server: Any, pg_schema: str
) -> None:
    """Each edit to a PostgreSQL schema is refused by the listing and by a read."""
    settings = Settings(
        backend="postgres",
        home=tmp_path / "home",
        postgres_dsn=postgres_server.dsn,
        postgres_schema=pg_schema,
        mark_sync="strict",
    )
    target = FlowvaultTarget(settings, lambda: _postgres(postgres_server.dsn, pg_schema))
    _flowvault_edit(target, edit)


# -- LangGraph's SqliteSaver with EncryptedSerializer ------------------------------


def _langgraph_outcome(edit: str, path: Path) -> str:
    """Make ``edit`` against SqliteSaver + EncryptedSerializer; return what its reads did."""
    serde = EncryptedSerializer.from_pycryptodome_aes(key=KEY[:16])
    with SqliteSaver.from_conn_string(str(path)) as saver:
        saver.serde = serde
        thread = _populate(saver)
        with _sqlite(path) as sql:
            older_writes = sql("SELECT * FROM writes WHERE checkpoint_id = ?", thread.ids[-1])
        saver.put_writes(
            _config("thread-a", thread.ids[-1]), [("notes", "later")], task_id="task-later"
        )
        newest = thread.ids[-1]
        with _sqlite(path) as sql:
            if edit == EDITS[0]:
                plain_type, plain = saver.serde.serde.dumps_typed({"forged": True})  # type: ignore[attr-defined]
                sql(
                    "UPDATE checkpoints SET type = ?, checkpoint = ? WHERE checkpoint_id = ?",
                    plain_type,
                    plain,
                    newest,
                )
            elif edit == EDITS[1]:
                other = sql(
                    "SELECT type, checkpoint FROM checkpoints WHERE thread_id = 'thread-b'"
                )[0]
                sql(
                    "UPDATE checkpoints SET type = ?, checkpoint = ? WHERE checkpoint_id = ?",
                    *other,
                    newest,
                )
            elif edit == EDITS[2]:
                sql("DELETE FROM checkpoints WHERE checkpoint_id = ?", newest)
            elif edit == EDITS[3]:
                sql("DELETE FROM checkpoints WHERE checkpoint_id = ?", thread.ids[0])
            elif edit == EDITS[4]:
                sql("DELETE FROM writes WHERE checkpoint_id = ?", newest)
            elif edit == EDITS[5]:
                sql("DELETE FROM writes WHERE checkpoint_id = ?", newest)
                marks = ", ".join("?" for _ in older_writes[0])
                for row in older_writes:
                    sql(f"INSERT INTO writes VALUES ({marks})", *row)  # noqa: S608 - placeholders
            else:
                sql("DELETE FROM checkpoints WHERE checkpoint_id = ?", newest)
                sql("DELETE FROM writes WHERE checkpoint_id = ?", newest)
        try:
            _read_everything(saver, thread)
        except Exception as refused:
            return f"refused ({type(refused).__name__})"
        return "accepted"


def _documented() -> dict[str, tuple[str, str]]:
    """Return the tamper table of docs/langgraph.md: edit -> (flowvault, LangGraph)."""
    text = DOCS.read_text(encoding="utf-8")
    rows = re.findall(r"^\| (.+?) \| (.+?) \| (.+?) \|$", text, flags=re.MULTILINE)
    return {edit: (ours, theirs) for edit, ours, theirs in rows if edit in EDITS}


def test_langgraph_encrypted_saver_accepts_what_the_docs_say(tmp_path: Path) -> None:
    """The same edits against SqliteSaver + EncryptedSerializer give docs/langgraph.md's column."""
    measured = {
        edit: _langgraph_outcome(edit, tmp_path / f"lg-{number}.db")
        for number, edit in enumerate(EDITS)
    }
    documented = _documented()
    assert set(documented) == set(EDITS)
    assert {edit: theirs for edit, (_, theirs) in documented.items()} == measured
    assert all(ours.startswith("refused") for ours, _ in documented.values())
