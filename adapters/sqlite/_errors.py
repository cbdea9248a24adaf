"""Translation of ``sqlite3`` exceptions into flowvault errors.

Decisions are made on SQLite's numeric result codes, never on message text,
which changes between SQLite releases and locales. Messages name the result
code only: a driver message may quote SQL, and flowvault messages never
carry anything a caller wrote.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from flowvault.domain import (
    FlowvaultError,
    IntegrityFailure,
    InvalidInput,
    StoreBusy,
    StoreUnavailable,
)

_BUSY = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
_CORRUPT = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})


def _primary_code(exc: sqlite3.Error) -> int | None:
    """Return the primary result code; extended codes keep it in the low byte."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def _code_name(exc: sqlite3.Error) -> str:
    name = getattr(exc, "sqlite_errorname", None)
    return name if isinstance(name, str) else type(exc).__name__


def is_busy(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` means another connection holds a lock this one needs."""
    return _primary_code(exc) in _BUSY


def translate(exc: sqlite3.Error, busy_timeout: float) -> FlowvaultError:
    """Return the flowvault error that stands for ``exc``."""
    primary, name = _primary_code(exc), _code_name(exc)
    if primary in _BUSY:
        return StoreBusy(
            f"database stayed locked past the busy timeout of {busy_timeout:g} s",
            code=name,
            busy_timeout_ms=round(busy_timeout * 1000),
        )
    if primary in _CORRUPT:
        return IntegrityFailure(
            f"database file is damaged or not a SQLite database ({name})", code=name
        )
    if isinstance(exc, sqlite3.ProgrammingError):
        return StoreUnavailable(f"database connection is closed or unusable ({name})", code=name)
    return StoreUnavailable(f"database operation failed ({name})", code=name)


def translated_error(exc: Exception, busy_timeout: float) -> Exception | None:
    """Return the flowvault error that stands for a driver-side ``exc``; ``None`` for others."""
    if isinstance(exc, sqlite3.Error):
        return translate(exc, busy_timeout)
    if isinstance(exc, UnicodeEncodeError):
        return InvalidInput("text arguments must be valid Unicode (no lone surrogates)")
    if isinstance(exc, UnicodeDecodeError):
        return IntegrityFailure("a stored text value is not valid UTF-8")
    if isinstance(exc, OverflowError):
        return InvalidInput("an integer argument is outside SQLite's 64-bit range")
    if isinstance(exc, OSError):
        reason = exc.strerror or type(exc).__name__
        return StoreUnavailable(f"cannot use the database files ({reason})")
    return None


@contextmanager
def translated(busy_timeout: float) -> Iterator[None]:
    """Re-raise driver exceptions from the block as flowvault errors, chained to the original."""
    try:
        yield
    except Exception as exc:
        error = translated_error(exc, busy_timeout)
        if error is None:
            raise
        raise error from exc
