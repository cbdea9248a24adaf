"""Group commit: units from concurrent threads share one transaction and one sync.

A durable commit costs one ``fsync`` whatever it carries, so threads that
commit at the same time queue their units, and whichever thread takes the
writer lock next commits every queued unit in one ``BEGIN IMMEDIATE`` ...
``COMMIT``. Each unit keeps its own guards and its own outcome: in a group
of more than one, a unit runs inside a savepoint, and a unit whose guard or
constraint fails is rolled back to that savepoint alone. Every caller
returns only after the ``COMMIT`` that carried its unit has returned, so an
acknowledgement still means the unit is on disk. A failure of the
transaction itself (busy, I/O, a refused ``COMMIT``) fails every unit of the
group, none of which then landed.
"""

from __future__ import annotations

import copy
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from flowvault.adapters.sqlite import _queries as sql
from flowvault.adapters.sqlite._commit import PreparedUnit
from flowvault.adapters.sqlite._connect import rollback_quietly
from flowvault.adapters.sqlite._errors import translate, translated
from flowvault.adapters.sqlite._locks import begin_immediate
from flowvault.application import UnitOfWork
from flowvault.domain import FlowvaultError, InvalidInput, StoreUnavailable

MAX_GROUP = 64
"""Units per transaction at most, so one group's write lock stays short."""

_SAVEPOINT = "SAVEPOINT flowvault_unit"
_RELEASE = "RELEASE flowvault_unit"
_UNDO = "ROLLBACK TO flowvault_unit"

Check = Callable[[sqlite3.Connection, UnitOfWork], None]
Apply = Callable[[sqlite3.Connection, PreparedUnit], None]


@dataclass(slots=True, eq=False)
class Ticket:
    """One caller's unit, and its outcome once a group carried it."""

    unit: UnitOfWork
    prepared: PreparedUnit
    resolved: bool = False
    error: BaseException | None = None

    def succeed(self) -> None:
        """Mark the unit committed."""
        self.resolved = True

    def fail(self, error: BaseException) -> None:
        """Mark the unit refused or lost with its group; ``error`` is raised to its caller."""
        self.resolved = True
        self.error = error

    def settle(self) -> None:
        """Return if the unit committed; otherwise raise its error."""
        if not self.resolved:
            raise StoreUnavailable("the unit was never committed (its group was abandoned)")
        if self.error is not None:
            raise self.error


class CommitQueue:
    """Units waiting for the writer, in arrival order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[Ticket] = []

    def __len__(self) -> int:
        return len(self._pending)

    def put(self, ticket: Ticket) -> None:
        """Queue ``ticket`` for the next group."""
        with self._lock:
            self._pending.append(ticket)

    def take(self) -> list[Ticket]:
        """Remove and return the next group: the oldest ``MAX_GROUP`` tickets."""
        with self._lock:
            group, self._pending = self._pending[:MAX_GROUP], self._pending[MAX_GROUP:]
        return group


@dataclass(slots=True)
class CommitCounts:
    """Committed transactions and units since the store opened (one writer's view)."""

    transactions: int = 0
    units: int = 0
    grouped_units: int = 0
    """Units that shared their transaction with at least one other unit."""

    def add(self, group: list[Ticket]) -> None:
        """Count ``group``'s committed units (the writer lock is held)."""
        landed = sum(1 for ticket in group if ticket.resolved and ticket.error is None)
        if landed:
            self.transactions += 1
            self.units += landed
            if landed > 1:
                self.grouped_units += landed


def _copy(error: BaseException) -> BaseException:
    """Return a fresh instance of ``error`` for another thread to raise.

    One exception object raised in several threads would have its traceback
    rewritten by each; every caller gets its own, chained to the same cause.
    """
    fresh = copy.copy(error)
    fresh.__cause__ = error.__cause__
    return fresh


def fail_group(group: list[Ticket], error: BaseException) -> None:
    """Fail every unresolved ticket of ``group`` with its own copy of ``error``."""
    first = True
    for ticket in group:
        if not ticket.resolved:
            ticket.fail(error if first else _copy(error))
            first = False


_UNIT_ERRORS = (FlowvaultError, sqlite3.IntegrityError, UnicodeEncodeError, OverflowError)
"""Errors that refuse one unit's content or guards; anything else fails the whole group."""


def _unit_error(exc: Exception, busy_timeout: float) -> FlowvaultError:
    if isinstance(exc, FlowvaultError):
        return exc
    if isinstance(exc, sqlite3.Error):
        error = translate(exc, busy_timeout)
    elif isinstance(exc, UnicodeEncodeError):
        error = InvalidInput("text arguments must be valid Unicode (no lone surrogates)")
    else:
        error = InvalidInput("an integer argument is outside SQLite's 64-bit range")
    error.__cause__ = exc
    return error


@contextmanager
def _savepoint(connection: sqlite3.Connection) -> Iterator[None]:
    connection.execute(_SAVEPOINT)
    yield
    connection.execute(_RELEASE)


def _apply_in_group(
    connection: sqlite3.Connection, ticket: Ticket, check: Check, apply: Apply, busy_timeout: float
) -> bool:
    """Apply one unit inside its savepoint; on a unit-level refusal undo it alone."""
    try:
        with _savepoint(connection):
            check(connection, ticket.unit)
            apply(connection, ticket.prepared)
    except _UNIT_ERRORS as exc:
        if not connection.in_transaction:
            raise
        connection.execute(_UNDO)
        connection.execute(_RELEASE)
        ticket.fail(_unit_error(exc, busy_timeout))
        return False
    return True


def commit_group(
    connection: sqlite3.Connection,
    group: list[Ticket],
    *,
    check: Check,
    apply: Apply,
    busy_timeout: float,
) -> None:
    """Commit ``group`` in one transaction and resolve every ticket; raise only interrupts.

    A transaction that carries at least one unit raises the store's epoch
    once, inside it, so a group that rolls back leaves the count alone.
    A group of one runs without a savepoint, exactly as a lone commit: any
    error rolls the transaction back and becomes that unit's error.
    """
    try:
        with translated(busy_timeout):
            begin_immediate(connection, busy_timeout)
            try:
                if len(group) == 1:
                    check(connection, group[0].unit)
                    apply(connection, group[0].prepared)
                    landed = group
                else:
                    landed = [
                        ticket
                        for ticket in group
                        if _apply_in_group(connection, ticket, check, apply, busy_timeout)
                    ]
                if landed:
                    connection.execute(sql.RAISE_EPOCH)
                    connection.execute("COMMIT")
                else:
                    connection.execute("ROLLBACK")
            except BaseException:
                rollback_quietly(connection)
                raise
    except Exception as exc:  # every ticket must be resolved, whatever failed
        fail_group(group, exc)
        return
    except BaseException:
        fail_group(group, StoreUnavailable("the commit was interrupted; the unit may have landed"))
        raise
    for ticket in landed:
        ticket.succeed()
