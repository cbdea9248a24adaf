"""Translation of psycopg exceptions into flowvault errors.

Decisions are made on the SQLSTATE (``exc.sqlstate``) and, for errors raised
before the server answered, on the exception class; never on message text,
which the server localises. Messages name the SQLSTATE only: a server
message can quote row values, and a connection error can quote the DSN.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeAlias

import psycopg
import psycopg_pool

from flowvault.domain import (
    FlowvaultError,
    IntegrityFailure,
    InvalidInput,
    RevisionConflict,
    StoreBusy,
    StoreUnavailable,
)

RETRYABLE = frozenset({"40001", "40P01"})
"""``serialization_failure`` and ``deadlock_detected``: the whole transaction may be re-run."""
_DATA_EXCEPTION = "22"
"""SQLSTATE class of values PostgreSQL cannot store (NUL in text, out-of-range numbers)."""


@dataclass(frozen=True, slots=True)
class Timeouts:
    """The session timeouts, named in ``STORE_BUSY`` errors so an operator knows what ran out."""

    statement_ms: int
    lock_ms: int


_Builder: TypeAlias = Callable[[str, Timeouts], FlowvaultError]


def _busy(code: str, timeouts: Timeouts) -> FlowvaultError:
    return StoreBusy(
        f"the database did not finish within the statement or lock timeout ({code})",
        sqlstate=code,
        statement_timeout_ms=timeouts.statement_ms,
        lock_timeout_ms=timeouts.lock_ms,
    )


def _conflict(code: str, _: Timeouts) -> FlowvaultError:
    return RevisionConflict(
        f"a concurrent transaction changed the same rows; retry ({code})",
        guard="transaction",
        sqlstate=code,
    )


def _damaged(code: str, _: Timeouts) -> FlowvaultError:
    return IntegrityFailure(f"the database reports damaged data ({code})", sqlstate=code)


def _unstorable(code: str, _: Timeouts) -> FlowvaultError:
    return InvalidInput(f"a value cannot be stored in PostgreSQL ({code})", sqlstate=code)


def _no_connection(code: str, _: Timeouts) -> FlowvaultError:
    return StoreUnavailable(
        "no database connection became available in time (server unreachable or pool exhausted)",
        sqlstate=code,
    )


def _closed(code: str, _: Timeouts) -> FlowvaultError:
    return StoreUnavailable("the store is closed", sqlstate=code)


def _failed(code: str, _: Timeouts) -> FlowvaultError:
    return StoreUnavailable(f"database operation failed ({code})", sqlstate=code)


BY_SQLSTATE: Mapping[str, _Builder] = {
    "57014": _busy,  # query_canceled: statement_timeout
    "55P03": _busy,  # lock_not_available: lock_timeout
    "40001": _conflict,  # serialization_failure, once retries ran out
    "40P01": _conflict,  # deadlock_detected, once retries ran out
    "23505": _conflict,  # unique_violation: a concurrent writer took the key first
    "XX001": _damaged,  # data_corrupted
    "XX002": _damaged,  # index_corrupted
}
"""Server errors by SQLSTATE; any other SQLSTATE outside class 22 is ``STORE_UNAVAILABLE``."""

BY_CLASS: tuple[tuple[type[psycopg.Error], _Builder], ...] = (
    (psycopg_pool.PoolTimeout, _no_connection),
    (psycopg_pool.PoolClosed, _closed),
    (psycopg.DataError, _unstorable),
)
"""Errors raised before the server answered, which carry no SQLSTATE."""


def _builder(exc: psycopg.Error, state: str | None) -> _Builder:
    if state is not None:
        return BY_SQLSTATE.get(state, _unstorable if state[:2] == _DATA_EXCEPTION else _failed)
    return next((build for kind, build in BY_CLASS if isinstance(exc, kind)), _failed)


def translate(exc: psycopg.Error, timeouts: Timeouts) -> FlowvaultError:
    """Return the flowvault error that stands for ``exc``."""
    state = getattr(exc, "sqlstate", None)
    state = state if isinstance(state, str) else None
    return _builder(exc, state)(state or type(exc).__name__, timeouts)


@contextmanager
def translated(timeouts: Timeouts) -> Iterator[None]:
    """Re-raise driver exceptions from the block as flowvault errors, chained to the original."""
    try:
        yield
    except psycopg.Error as exc:
        raise translate(exc, timeouts) from exc
    except UnicodeEncodeError as exc:
        raise InvalidInput("text arguments must be valid Unicode (no lone surrogates)") from exc
