"""Translation of psycopg exceptions into flowvault errors.

Decisions are made on the SQLSTATE (``exc.sqlstate``) and, for errors raised
before the server answered, on the exception class; never on message text,
which the server localises. Messages name the SQLSTATE only: a server
message can quote row values, and a connection error can quote the DSN.

The one exception is a failed connection attempt (``unreachable``): libpq
keeps the SQLSTATE of a refused login to itself, so its cause is read from
the English wording of libpq and the server, falling back to a generic cause
for any other wording. The message still quotes none of that text; it names
the cause, and the host, port, database and role from the DSN.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final, TypeAlias

import psycopg
import psycopg_pool
from psycopg.conninfo import conninfo_to_dict

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
        "no pooled database connection became available within the connect timeout "
        "(the server is gone, or every connection is busy: raise "
        "FLOWVAULT_POSTGRES_POOL_SIZE or FLOWVAULT_POSTGRES_CONNECT_TIMEOUT)",
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


_DEFAULT_HOST = "the default host"
"""What libpq reaches with no host named: ``PGHOST``, else the local socket."""


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value or "")


@dataclass(frozen=True, slots=True)
class Target:
    """Where a connection attempt went: host, port, database and role, never the password."""

    host: str
    port: str
    dbname: str
    user: str
    timeout_s: int

    @classmethod
    def of(cls, exc: psycopg.Error, dsn: str, timeout_s: int) -> Target:
        """Prefer what libpq used (environment defaults included), else what the DSN names."""
        used = exc.pgconn
        if used is not None:
            return cls(
                _text(used.host) or _DEFAULT_HOST,
                _text(used.port) or "5432",
                _text(used.db),
                _text(used.user),
                timeout_s,
            )
        named = conninfo_to_dict(dsn)
        return cls(
            _text(named.get("host")) or _DEFAULT_HOST,
            _text(named.get("port")) or "5432",
            _text(named.get("dbname")),
            _text(named.get("user")),
            timeout_s,
        )


@dataclass(frozen=True, slots=True)
class _Cause:
    name: str
    markers: tuple[str, ...]
    """Regular expressions, any of which in the lower-cased libpq message means this cause."""
    says: Callable[[Target], str]
    fix: str


_DSN = "FLOWVAULT_POSTGRES_DSN"
_CAUSES: Final = (
    _Cause(
        "unknown_database",
        (r'database ".*" does not exist',),
        lambda t: f"database {t.dbname!r} does not exist",
        f"create the database, or fix the database name in {_DSN}",
    ),
    _Cause(
        "unknown_role",
        (r'role ".*" does not exist',),
        lambda t: f"role {t.user!r} does not exist",
        f"create the role, or fix the user name in {_DSN}",
    ),
    _Cause(
        "authentication",
        ("authentication failed", "no password supplied", "password is required", "pg_hba.conf"),
        lambda t: f"the server refused the login of role {t.user!r}",
        f"fix the user or password ({_DSN}, PGPASSFILE or PGPASSWORD) or the server's pg_hba.conf",
    ),
    _Cause(
        "refused",
        ("connection refused",),
        lambda t: "connection refused (nothing listens on that port)",
        f"start the server, or fix the host and port in {_DSN}",
    ),
    _Cause(
        "unknown_host",
        ("failed to resolve host", "could not translate host name"),
        lambda t: f"the host name {t.host!r} does not resolve",
        f"fix the host in {_DSN}, or its DNS entry",
    ),
    _Cause(
        "server_full",
        ("too many clients", "too many connections", "connection slots are reserved"),
        lambda t: "the server has no free connection slots",
        "retry later, lower FLOWVAULT_POSTGRES_POOL_SIZE, or raise the server's max_connections",
    ),
    _Cause(
        "server_not_ready",
        ("starting up", "shutting down", "in recovery mode", "not yet accepting connections"),
        lambda t: "the server is starting up, shutting down or recovering",
        "retry once the server accepts connections",
    ),
    _Cause(
        "tls",
        ("ssl", "certificate"),
        lambda t: "the TLS negotiation failed",
        f"match the sslmode and certificates in {_DSN} to the server's TLS set-up",
    ),
)
"""Causes in the order they are tried; the first whose marker the libpq message holds wins."""

_TIMEOUT: Final = _Cause(
    "timeout",
    (),
    lambda t: f"no answer within {t.timeout_s} s",
    "check the host, port and firewall, or raise FLOWVAULT_POSTGRES_CONNECT_TIMEOUT",
)
_OTHER: Final = _Cause(
    "other",
    (),
    lambda t: "the connection attempt failed",
    f"check the server's log and {_DSN}",
)


def _cause(exc: psycopg.Error) -> _Cause:
    if isinstance(exc, psycopg.errors.ConnectionTimeout):
        return _TIMEOUT
    text = str(exc).lower()
    return next((c for c in _CAUSES if any(re.search(m, text) for m in c.markers)), _OTHER)


def unreachable(exc: psycopg.Error, target: Target) -> StoreUnavailable:
    """Return the one-line ``STORE_UNAVAILABLE`` for a failed attempt to connect to ``target``.

    The remedy goes in ``details["fix"]``, which the CLI prints as its
    ``fix:`` line.
    """
    cause = _cause(exc)
    return StoreUnavailable(
        f"cannot connect to PostgreSQL at {target.host}:{target.port}: {cause.says(target)}",
        cause=cause.name,
        fix=cause.fix,
    )
