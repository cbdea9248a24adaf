"""flowvault's log events and telemetry hook: one place every layer reports through.

Events travel as standard ``logging`` records under ``flowvault.*`` loggers,
so nothing is printed until a host routes them (the ``flowvault`` logger
carries a ``NullHandler``, so Python's last-resort handler stays quiet) and
a host that configured ``logging`` receives them without further set-up.
Each record's message is ``event key=value ...``; the fields themselves are
on the record as ``flowvault_event`` and ``flowvault_fields``.

The events on the commit path check their level (and whether telemetry
is on) before computing their fields; a disabled one then costs a cached
``isEnabledFor``. Fields are counts, codes, store
kinds, namespaces and key ids: never a payload, key or natural key; values
under secret-looking names are redacted all the same.

``Telemetry`` is the port an OpenTelemetry adapter implements; it is
process-wide (as OpenTelemetry's own providers are) and absent by default.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Final, Protocol

from flowvault.application._records import UnitOfWork
from flowvault.domain._sanitise import REDACTED, is_secret_key

ROOT_LOGGER: Final = "flowvault"

_root = logging.getLogger(ROOT_LOGGER)
if not any(isinstance(handler, logging.NullHandler) for handler in _root.handlers):
    _root.addHandler(logging.NullHandler())

Field = str | int | float | bool | None | tuple[str, ...] | Mapping[str, tuple[str, ...]]


class _Line:
    """A record's message, rendered only if a handler formats it."""

    __slots__ = ("event", "fields")

    def __init__(self, event: str, fields: Mapping[str, Field]) -> None:
        self.event = event
        self.fields = fields

    def __str__(self) -> str:
        parts = [self.event]
        parts.extend(f"{key}={_text(value)}" for key, value in self.fields.items())
        return " ".join(parts)


def _text(value: Field) -> str:
    if isinstance(value, tuple):
        return ",".join(value)
    if isinstance(value, Mapping):
        return ";".join(f"{key}:{_text(item)}" for key, item in value.items())
    return str(value)


class EventLog:
    """A ``flowvault.*`` logger taking an event name and structured fields."""

    __slots__ = ("_logger",)

    def __init__(self, name: str) -> None:
        self._logger = logging.getLogger(name)

    def enabled(self, level: int) -> bool:
        """Whether an event at ``level`` would reach any handler; check before costly fields."""
        return self._logger.isEnabledFor(level)

    def debug(self, event: str, **fields: Field) -> None:
        """Log ``event`` at debug."""
        if self._logger.isEnabledFor(logging.DEBUG):
            self._emit(logging.DEBUG, event, fields)

    def info(self, event: str, **fields: Field) -> None:
        """Log ``event`` at info."""
        if self._logger.isEnabledFor(logging.INFO):
            self._emit(logging.INFO, event, fields)

    def warning(self, event: str, **fields: Field) -> None:
        """Log ``event`` at warning."""
        if self._logger.isEnabledFor(logging.WARNING):
            self._emit(logging.WARNING, event, fields)

    def _emit(self, level: int, event: str, fields: dict[str, Field]) -> None:
        for key in fields:
            if is_secret_key(key):
                fields[key] = REDACTED
        self._logger.log(
            level,
            _Line(event, fields),
            extra={"flowvault_event": event, "flowvault_fields": fields},
        )


class Telemetry(Protocol):
    """Where traces and metrics go; the OpenTelemetry adapter implements it."""

    def unit_committed(
        self, store: str, unit_kind: str, records: int, started_ns: int, ended_ns: int
    ) -> None:
        """Record a committed unit of work (wall-clock nanoseconds, for a span)."""

    def revision_conflict(self, store: str, unit_kind: str) -> None:
        """Count a unit of work refused because a guard no longer held."""

    def store_synced(self, store: str, units: int) -> None:
        """Count one durable transaction carrying ``units`` units of work."""

    def unit_retried(self, what: str) -> None:
        """Count a unit of work rebuilt after losing a race."""

    def key_used(self, operation: str, key_id: str) -> None:
        """Count a seal or an open under ``key_id``."""

    def ledger_verified(self, ok: bool, findings: tuple[str, ...]) -> None:
        """Count a ledger verification, with its finding codes when it failed."""


_telemetry: Telemetry | None = None


def use_telemetry(telemetry: Telemetry | None) -> None:
    """Send traces and metrics to ``telemetry`` from now on (``None``: stop)."""
    global _telemetry  # noqa: PLW0603 - one process-wide hook, as OpenTelemetry's providers are
    _telemetry = telemetry


_store_log: Final = EventLog("flowvault.store")
_retry_log: Final = EventLog("flowvault.retry")
_key_log: Final = EventLog("flowvault.keys")
_compaction_log: Final = EventLog("flowvault.compaction")
_verify_log: Final = EventLog("flowvault.verify")


def unit_kind(namespaces: tuple[str, ...], appends: int, trims: int, drops: int = 0) -> str:
    """Name a unit by what it touches: its record namespaces, ``ledger``, ``trim`` and ``drop``."""
    parts = sorted(set(namespaces))
    if appends:
        parts.append("ledger")
    if trims:
        parts.append("trim")
    if drops:
        parts.append("drop")
    return "+".join(parts) or "empty"


def _shape(unit: UnitOfWork) -> tuple[str, int]:
    namespaces = tuple(u.header.namespace for u in unit.upserts)
    namespaces += tuple(d.namespace for d in unit.deletes)
    kind = unit_kind(namespaces, len(unit.appends), len(unit.trims), len(unit.drops))
    writes = len(unit.upserts) + len(unit.deletes) + len(unit.appends) + len(unit.trims)
    return kind, writes + len(unit.drops)


def unit_committed(store: str, unit: UnitOfWork, started: float) -> None:
    """Report a committed unit of work; ``started`` is its ``time.perf_counter()`` at entry."""
    telemetry = _telemetry
    if telemetry is None and not _store_log.enabled(logging.DEBUG):
        return
    seconds = time.perf_counter() - started
    kind, records = _shape(unit)
    _store_log.debug(
        "unit_committed",
        store=store,
        unit_kind=kind,
        records_written=records,
        duration_ms=round(seconds * 1000, 3),
    )
    if telemetry is not None:
        ended = time.time_ns()
        telemetry.unit_committed(store, kind, records, ended - int(seconds * 1e9), ended)


def revision_conflict(store: str, unit: UnitOfWork, guard: object) -> None:
    """Report a unit refused because a revision or ledger head had moved."""
    telemetry = _telemetry
    if telemetry is None and not _store_log.enabled(logging.DEBUG):
        return
    kind, _ = _shape(unit)
    _store_log.debug(
        "revision_conflict",
        store=store,
        unit_kind=kind,
        guard=guard if isinstance(guard, str) else None,
    )
    if telemetry is not None:
        telemetry.revision_conflict(store, kind)


def store_synced(store: str, units: int) -> None:
    """Report one durable transaction (one sync) carrying ``units`` units."""
    telemetry = _telemetry
    if telemetry is None and not _store_log.enabled(logging.DEBUG):
        return
    _store_log.debug("store_synced", store=store, units=units)
    if telemetry is not None:
        telemetry.store_synced(store, units)


def unit_retried(what: str, lost: int, pause_s: float) -> None:
    """Report a lost race that a service retries after ``pause_s``."""
    _retry_log.debug("unit_retried", what=what, lost_races=lost, pause_ms=round(pause_s * 1000, 3))
    if _telemetry is not None:
        _telemetry.unit_retried(what)


def retries_exhausted(what: str, lost: int, spent_s: float) -> None:
    """Report a unit given up on after ``lost`` lost races."""
    _retry_log.info(
        "retries_exhausted", what=what, lost_races=lost, spent_ms=round(spent_s * 1000, 3)
    )


def key_used(operation: str, key_id: str) -> None:
    """Report a seal or an open under ``key_id`` (the id, never the key)."""
    telemetry = _telemetry
    if telemetry is None and not _key_log.enabled(logging.DEBUG):
        return
    _key_log.debug("key_used", operation=operation, key_id=key_id)
    if telemetry is not None:
        telemetry.key_used(operation, key_id)


def compacted(explicit: bool, completed: bool) -> None:
    """Report a compaction that ran (``explicit``: asked for, not after a commit)."""
    _compaction_log.debug("compaction_finished", explicit=explicit, completed=completed)


def ledger_verified(ok: bool, streams: int, events: int, findings: tuple[str, ...]) -> None:
    """Report a ledger verification and, when it failed, its finding codes."""
    if ok:
        _verify_log.debug("ledger_verified", ok=True, streams=streams, events=events)
    else:
        _verify_log.info(
            "ledger_verification_failed",
            ok=False,
            streams=streams,
            events=events,
            findings=findings,
        )
    if _telemetry is not None:
        _telemetry.ledger_verified(ok, findings)
