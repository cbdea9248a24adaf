"""Terminal input and output for commands, injectable so tests need no terminal.

On a terminal, tables and progress bars are drawn with rich; otherwise the
same content is printed as plain text, and ``--json`` prints exactly one
JSON document on stdout.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, TextIO, TypeVar

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from flowvault.domain import FlowvaultError
from flowvault.domain._canonical import canonical_json

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")


SCHEMA_VERSION = 1
"""The ``schema_version`` every ``--json`` document carries; bumped only when a key is renamed
or removed (``docs/cli.md``)."""


def versioned(document: object) -> object:
    """Return ``document`` with ``schema_version`` first; a non-object is left as it is."""
    if isinstance(document, Mapping):
        return {"schema_version": SCHEMA_VERSION, **document}
    return document


def fields_document(item: DataclassInstance) -> dict[str, object]:
    """Return a dataclass's fields as a ``--json`` object, in declaration order.

    Mappings are copied into plain dicts, so the document never shares state
    with the value it describes.
    """
    document: dict[str, object] = {}
    for spec in fields(item):
        value = getattr(item, spec.name)
        document[spec.name] = dict(value) if isinstance(value, Mapping) else value
    return document


FIXES: dict[str, str] = {
    "FLOWVAULT_ERROR": "rerun with --debug and report the message: no more specific code applies",
    "INVALID_INPUT": "correct the argument the message names (see the verb's --help)",
    "PAYLOAD_TOO_LARGE": "send less: split the payload or document below the limit named above",
    "INVALID_DEFINITION": "fix the workflow definition the message names, then register it again",
    "INVALID_TRANSITION": "check the current status ('flowvault runs show'); this move is not "
    "allowed from it",
    "REVISION_CONFLICT": "someone changed it meanwhile; reload and retry",
    "RUN_FENCED": "another host holds this run or took it over; stop working on it",
    "NOT_FOUND": "check the id; list what exists with the matching 'list' verb",
    "IDEMPOTENCY_CONFLICT": "use a new idempotency key: this one was used for different content",
    "INTEGRITY_FAILURE": (
        "check that FLOWVAULT_KEY or the key file is the key this store was sealed with; if it "
        "is, treat this as tampering and restore from a backup"
    ),
    "STORE_BUSY": "another process holds the store; retry, or raise FLOWVAULT_BUSY_TIMEOUT",
    "STORE_UNAVAILABLE": "check FLOWVAULT_HOME / FLOWVAULT_POSTGRES_DSN and that the store exists",
    "KEY_REQUIRED": "set FLOWVAULT_KEY or restore the key file named above",
    "KEY_EXHAUSTED": "run 'flowvault keys add', then 'flowvault rotate-key'",
    "STORE_ROLLED_BACK": (
        "put the newest copy of the database back; if this older copy was restored on "
        "purpose, run 'flowvault accept-restore'"
    ),
    "STORE_NOT_EMPTY": "give --to a new SQLite home or an unused PostgreSQL schema",
    "INSECURE_PERMISSIONS": "run the chmod named above (or allow it in the settings)",
    "SCHEMA_TOO_NEW": "upgrade flowvault: a newer version wrote this store",
    "NOT_BOUND": "wrap the host's lifetime in flowvault.composition.bind(bootstrap(...))",
    "DEFINITION_REFERENCED": "pass overwrite=True to replace it; keep a definition runs "
    "still reference",
    "CHECKPOINT_INTEGRITY_FAILURE": (
        "do not resume from this checkpoint: check the store key, then treat it as tampering "
        "and restore from a backup"
    ),
    "CHECKPOINT_CONSUMED": "a checkpoint resumes once: see what consumed it with "
    "'flowvault approvals list --run RUN_ID', and pause again with a new checkpoint",
    "INTEGRITY_KEY_REQUIRED": "build the service with the store's integrity key "
    "(bootstrap() wires it)",
    "APPROVAL_REQUEST_CONFLICT": "decide or let expire the pending approval for this checkpoint "
    "and audience ('flowvault approvals list --status pending')",
    "APPROVAL_EXPIRED": "the deadline passed and the expiry is recorded: ask again with a new "
    "checkpoint and a later deadline (on a new run if this one failed)",
    "APPROVAL_DECISION_NOT_ALLOWED": "pass one of the allowed decisions that "
    "'flowvault approvals show APPROVAL_ID' lists",
    "APPROVAL_ALREADY_DECIDED": "nothing to do: 'flowvault approvals show APPROVAL_ID' prints "
    "its status and who decided (as a digest)",
    "DECISION_SIGNATURE_INVALID": (
        "sign the output of 'flowvault approvals statement' with the actor's registered key "
        "and pass it with --signature-file"
    ),
}
"""One-line fixes printed under an error, by code: every code has its own."""


class _PlainProgress:
    """Progress as plain lines on a stream: throttled by time, with a closing line."""

    def __init__(self, stream: TextIO, label: str, total: int | None, interval: float) -> None:
        self._stream = stream
        self._label = label
        self._total = total
        self._interval = interval
        self._last = time.monotonic()
        self.done = 0

    def _write(self, text: str) -> None:
        self._stream.write(text + "\n")
        self._stream.flush()

    def _count(self, done: int) -> str:
        return f"{done}" if self._total is None else f"{done}/{self._total}"

    def update(self, done: int) -> None:
        """Record ``done`` units; print it if the interval has passed since the last line."""
        self.done = done
        now = time.monotonic()
        if now - self._last >= self._interval:
            self._last = now
            self._write(f"{self._label}: {self._count(done)}")

    def finish(self, done: int) -> None:
        """Print the closing line with the final count."""
        self._write(f"{self._label}: {self._count(done)} done")


@dataclass(slots=True)
class CommandIO:
    """Where a command writes, whether it may ask questions, and in which format."""

    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)
    stdin: TextIO = field(default_factory=lambda: sys.stdin)
    json_output: bool = False
    progress_interval: float = 2.0
    """Least seconds between two plain progress lines (``FLOWVAULT_PROGRESS_INTERVAL``)."""

    @property
    def interactive(self) -> bool:
        """True when a person can answer a prompt."""
        return self.stdin.isatty() and self.out.isatty()

    @property
    def rich(self) -> bool:
        """True when human output may use colour, tables and progress bars."""
        return not self.json_output and self.out.isatty()

    def confirm(self, question: str) -> bool:
        """Ask a yes/no question on stderr; anything but an explicit yes is no.

        The question goes to stderr so that stdout carries only the result
        (one JSON document with ``--json``).
        """
        self.err.write(f"{question} [y/N] ")
        self.err.flush()
        return self.stdin.readline().strip().lower() in {"y", "yes"}

    def emit(self, document: object, lines: Sequence[str]) -> None:
        """Print ``document`` as one JSON line, or ``lines`` for a person."""
        if self.json_output:
            self.out.write(canonical_json(versioned(document)) + "\n")
        else:
            self.out.write("\n".join(lines) + "\n")

    def say(self, line: str) -> None:
        """Print one line for a person (nothing in ``--json`` mode)."""
        if not self.json_output:
            self.out.write(line + "\n")
            self.out.flush()

    def table(self, title: str, columns: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
        """Print a table for a person: rich on a terminal, tab-separated otherwise.

        On a terminal too narrow for a cell, the cell folds onto more lines
        instead of being cut, so an id can always be copied whole into ``show``.
        """
        if self.json_output:
            return
        cells = [[str(cell) for cell in row] for row in rows]
        if self.rich:
            table = Table(title=title)
            for column in columns:
                table.add_column(column, overflow="fold")
            for row in cells:
                table.add_row(*row)
            Console(file=self.out).print(table)
            return
        self.out.write("\t".join(columns) + "\n")
        for row in cells:
            self.out.write("\t".join(row) + "\n")

    def progress(self, items: Iterable[T], *, total: int | None, label: str) -> Iterator[T]:
        """Yield ``items`` with a bar on a terminal, else periodic plain lines on stderr.

        Off a terminal (a pipe, a log, cron) a line ``label: done/total`` is
        printed at most once per ``progress_interval`` seconds, and a last
        ``... done`` line at the end, so a long job shows it is moving
        without a line per item. ``--json`` keeps stderr quiet.
        """
        if self.json_output:
            yield from items
            return
        if self.rich:
            with Progress(console=Console(file=self.err), transient=True) as bar:
                task = bar.add_task(label, total=total)
                for item in items:
                    yield item
                    bar.advance(task)
            return
        lines = _PlainProgress(self.err, label, total, self.progress_interval)
        done = 0
        for item in items:
            yield item
            done += 1
            lines.update(done)
        lines.finish(done)

    @contextmanager
    def tracker(self, *, total: int, label: str) -> Iterator[Callable[[int], None]]:
        """Yield ``update(done)`` for work measured in units: a bar on a terminal.

        Off a terminal updates print as ``progress`` does, at most one line
        per ``progress_interval`` seconds plus a last one; ``--json`` keeps
        stderr quiet.
        """
        if self.rich:
            with Progress(console=Console(file=self.err), transient=True) as bar:
                task = bar.add_task(label, total=total)
                yield lambda done: bar.update(task, completed=done)
            return
        if self.json_output:
            yield lambda done: None
            return
        lines = _PlainProgress(self.err, label, total, self.progress_interval)
        yield lines.update
        lines.finish(lines.done)

    def fail(self, error: FlowvaultError) -> int:
        """Report a flowvault error with its code and a one-line fix; return exit status 1.

        An error that knows its own remedy (``details["fix"]``) prints that
        instead of its code's general one.
        """
        own = error.details.get("fix")
        fix = own if isinstance(own, str) else FIXES.get(error.code)
        if self.json_output:
            body = versioned({"error": {"code": error.code, "message": error.message, "fix": fix}})
            self.out.write(json.dumps(body, sort_keys=True) + "\n")
        else:
            self.err.write(f"error: {error.code}: {error.message}\n")
            if fix:
                self.err.write(f"  fix: {fix}\n")
        return 1
