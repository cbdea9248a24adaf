"""``flowvault status``: a store's schema version, keys, counts, files and durability.

Also what an operator watches: workflows by state, approvals by status,
the ledger's streams and events, and how far the high-water mark is behind
the store. Reads no sealed payload; on a cold root it says so and creates
nothing. The status (and ``doctor``) open the store alone, with no cipher,
so they never resolve (so never create) a key; only the high-water mark,
MAC'd under the key, is read with a key that already exists.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from flowvault.adapters.cli._context import CliContext, CliSettings
from flowvault.adapters.cli._io import CommandIO
from flowvault.adapters.cli._keyed import existing_ring
from flowvault.adapters.cli._streams import every_stream
from flowvault.adapters.cli._verbs import for_backend
from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.sqlite._doctor import probe_database
from flowvault.adapters.sqlite._schema import SCHEMA_VERSION as SQLITE_SCHEMA_VERSION
from flowvault.application import SecureObjectStore, StoreCapabilities, StoreStats
from flowvault.application._record_kinds import APPROVALS
from flowvault.application._records import MAX_LIST_LIMIT
from flowvault.application._workflow_records import WORKFLOWS
from flowvault.domain import FlowvaultError, IntegrityFailure, StoreRolledBack, StoreUnavailable


def store_location(settings: CliSettings) -> str:
    """Where the store lives, as the store verbs print it."""
    if settings.backend == "postgres":
        return f"postgres schema {settings.postgres_schema}"
    if settings.backend == "memory":
        return "memory (nothing durable)"
    return str(settings.database_path)


def store_stats(capabilities: StoreCapabilities) -> StoreStats:
    """Return the store's counts; ``StoreUnavailable`` for a store that keeps none."""
    if capabilities.stats is None:
        raise StoreUnavailable("this store cannot report its counts (no StoreStats)")
    return capabilities.stats


@contextmanager
def opened_store(context: CliContext, *, lenient: bool = False) -> Iterator[SecureObjectStore]:
    """Open the store alone: no cipher, so no key is read, resolved or created."""
    store = context.open_store(lenient=lenient)
    try:
        yield store
    finally:
        store.close()


@dataclass(frozen=True, slots=True)
class StoreStatus:
    """A store's shape, read without opening any sealed payload.

    ``files`` maps each file of the store to its size in bytes, ``None``
    when absent; ``schema_version`` is what the store records, next to the
    ``supported_schema_version`` this build writes.
    """

    backend: str
    home: str
    location: str
    cold_root: bool = False
    schema_version: int | None = None
    supported_schema_version: int | None = None
    key_ids: Mapping[str, int] = field(default_factory=dict)
    namespaces: Mapping[str, int] = field(default_factory=dict)
    files: Mapping[str, int | None] = field(default_factory=dict)
    durability: Mapping[str, str | int | float] = field(default_factory=dict)
    activity: Activity | None = None


@dataclass(frozen=True, slots=True)
class HighWater:
    """The store's commit count beside the high-water mark's, read without writing the mark.

    ``state`` is ``None`` where there is no store, else ``ok`` (the mark
    verified), ``not_kept`` (no mark is configured), ``not_started`` (none
    written yet), ``no_key`` (the mark is MAC'd under a key this process
    does not have), ``rolled_back`` (the store is below the mark) or
    ``invalid`` (the mark does not verify).
    ``lag_commits`` is the commit count minus the mark's: the commits the
    mark has not recorded yet (it follows the store about 0.1 s behind by
    default, at once in the strict mode); ``None`` unless both are known.
    """

    state: str | None
    commit_count: int | None
    mark_commit_count: int | None = None

    @property
    def lag_commits(self) -> int | None:
        """How many commits the mark is behind the store (negative: the store is behind)."""
        if self.commit_count is None or self.mark_commit_count is None:
            return None
        return self.commit_count - self.mark_commit_count


@dataclass(frozen=True, slots=True)
class Activity:
    """What an operator watches: workflows by state, approvals by status, the ledger's size.

    Approvals are counted by the status each record was written with: one
    pending past its deadline counts as pending until its expiry is
    recorded (``approvals expire``, or a late decision).
    """

    workflows_by_state: Mapping[str, int]
    approvals_by_status: Mapping[str, int]
    ledger_streams: int
    ledger_events: int
    high_water: HighWater


def _activity_lines(activity: Activity) -> list[str]:
    states = ", ".join(f"{name} {count}" for name, count in activity.workflows_by_state.items())
    approvals = activity.approvals_by_status
    mark = activity.high_water
    lag = "unknown" if mark.lag_commits is None else f"{mark.lag_commits} commit(s)"
    return [
        f"workflows by state: {states or 'none'}",
        f"approvals pending: {approvals.get('pending', 0)}",
        f"approvals expired: {approvals.get('expired', 0)}",
        f"approvals decided: {approvals.get('decided', 0)}",
        f"ledger: {activity.ledger_events} event(s) in {activity.ledger_streams} stream(s)",
        f"commit count: {'unknown' if mark.commit_count is None else mark.commit_count}",
        f"high-water mark: {mark.state}, lag {lag}",
    ]


def _durability_line(name: str, value: object) -> str:
    if name.endswith("_s"):
        return f"{name.removesuffix('_s').replace('_', ' ')}: {value} s"
    return f"{name.replace('_', ' ')}: {value}"


def _status_lines(status: StoreStatus) -> list[str]:
    lines = [f"backend: {status.backend}", f"home: {status.home}", f"store: {status.location}"]
    if status.cold_root:
        return [*lines, "cold root: no store exists here; nothing was created"]
    lines.append(
        f"schema version: {status.schema_version} "
        f"(this flowvault writes {status.supported_schema_version})"
    )
    lines += [_durability_line(name, value) for name, value in status.durability.items()]
    if status.activity is not None:
        lines += _activity_lines(status.activity)
    return lines


def _activity_document(activity: Activity | None) -> dict[str, object]:
    if activity is None:
        activity = Activity({}, {}, 0, 0, HighWater(None, None))
    approvals = activity.approvals_by_status
    mark = activity.high_water
    return {
        "workflows_by_state": [
            {"state": state, "workflows": count}
            for state, count in activity.workflows_by_state.items()
        ],
        "approvals_pending": approvals.get("pending", 0),
        "approvals_expired": approvals.get("expired", 0),
        "approvals_decided": approvals.get("decided", 0),
        "ledger_streams": activity.ledger_streams,
        "ledger_events": activity.ledger_events,
        "commit_count": mark.commit_count,
        "high_water_state": mark.state,
        "high_water_commit_count": mark.mark_commit_count,
        "high_water_lag_commits": mark.lag_commits,
    }


def status_document(status: StoreStatus) -> dict[str, object]:
    """Return the ``--json`` document: field names as keys, data (ids, paths) only as values."""
    return {
        "backend": status.backend,
        "home": status.home,
        "location": status.location,
        "cold_root": status.cold_root,
        "store_schema_version": status.schema_version,
        "supported_schema_version": status.supported_schema_version,
        "key_ids": [{"key_id": key, "records": n} for key, n in status.key_ids.items()],
        "namespaces": [{"namespace": name, "records": n} for name, n in status.namespaces.items()],
        "files": [{"path": path, "size_bytes": size} for path, size in status.files.items()],
        "durability": dict(status.durability),
        **_activity_document(status.activity),
    }


def _size(size: int | None) -> str:
    return "absent" if size is None else f"{size} bytes"


def _counts(io: CommandIO, title: str, column: str, counts: Mapping[str, int]) -> None:
    if counts:
        io.table(title, [column, "records"], sorted(counts.items()))
    else:
        io.say(f"{title}: none")


def status_command(status: StoreStatus, io: CommandIO) -> int:
    """Print the store's status (or that the root is cold); return exit status 0."""
    io.emit(status_document(status), _status_lines(status))
    if status.cold_root:
        return 0
    _counts(io, "key ids in use", "key id", status.key_ids)
    _counts(io, "namespaces", "namespace", status.namespaces)
    if status.files:
        rows = [(path, _size(size)) for path, size in status.files.items()]
        io.table("files", ["file", "size"], rows)
    return 0


# -- gathering and arguments ----------------------------------------------------


def _file_sizes(settings: CliSettings) -> dict[str, int | None]:
    paths = [settings.database_path, *settings.database_sidecars, settings.key_path]
    sizes: dict[str, int | None] = {}
    for path in paths:
        try:
            sizes[str(path)] = path.stat().st_size
        except FileNotFoundError:
            sizes[str(path)] = None
    return sizes


def _counted_status(
    context: CliContext,
    store: SecureObjectStore,
    backend: str,
    versions: tuple[int | None, int],
    *,
    durability: Mapping[str, str | int | float],
    files: Mapping[str, int | None],
) -> StoreStatus:
    """Build a backend's status around the counts every backend shows, read from its open store.

    ``versions`` is the schema version the store records, then the one this build writes.
    """
    settings = context.settings
    stats = store_stats(StoreCapabilities.of(store))
    return StoreStatus(
        backend=backend,
        home=str(settings.home),
        location=store_location(settings),
        schema_version=versions[0],
        supported_schema_version=versions[1],
        key_ids=stats.key_id_counts(),
        namespaces=stats.namespace_counts(),
        files=files,
        durability=durability,
        activity=activity(context, store),
    )


def label_counts(store: SecureObjectStore, namespace: str, label: str) -> dict[str, int]:
    """Count a namespace's records by one label, reading metadata only, in label order."""
    counts: Counter[str] = Counter()
    cursor: str | None = None
    while True:
        page = store.list(namespace, cursor=cursor, limit=MAX_LIST_LIMIT)
        counts.update(str(item.labels.get(label, "unlabelled")) for item in page.items)
        cursor = page.next_cursor
        if cursor is None:
            return dict(sorted(counts.items()))


def high_water(context: CliContext, store: SecureObjectStore) -> HighWater:
    """Compare the store with its high-water mark as ``doctor`` does, writing nothing."""
    epoch = StoreCapabilities.of(store).epoch
    count = None if epoch is None else epoch.epoch()
    try:
        ring = existing_ring(context)
    except FlowvaultError:
        ring = None
    if ring is None:
        return HighWater("no_key", count)
    guard = context.anti_rollback(store, AesGcmCipher.from_ring(ring), None)
    if guard is None:
        return HighWater("not_kept", count)
    try:
        seen = guard.inspect()
    except StoreRolledBack as error:
        mark = error.details.get("high_water")
        return HighWater("rolled_back", count, mark if isinstance(mark, int) else None)
    except IntegrityFailure:
        return HighWater("invalid", count)
    if seen is None:
        return HighWater("not_started", count)
    return HighWater("ok", count, seen)


def activity(context: CliContext, store: SecureObjectStore) -> Activity:
    """Gather what an operator watches, from labels, stream heads and the mark alone."""
    streams = events = 0
    for stream in every_stream(store):
        streams += 1
        events += stream.size
    return Activity(
        workflows_by_state=label_counts(store, WORKFLOWS, "state"),
        approvals_by_status=label_counts(store, APPROVALS, "status"),
        ledger_streams=streams,
        ledger_events=events,
        high_water=high_water(context, store),
    )


def _seconds(value: float) -> int | float:
    return int(value) if value.is_integer() else value


def _sqlite_status(context: CliContext) -> StoreStatus:
    """Sizes are taken before the store opens, so they show the files at rest."""
    settings = context.settings
    files = _file_sizes(settings)
    durability = {
        "synchronous": settings.synchronous,
        "busy_timeout_s": _seconds(settings.busy_timeout),
    }
    with (
        opened_store(context) as store,
        probe_database(settings.database_path, settings.busy_timeout) as probe,
    ):
        version = probe.schema_version()
        return _counted_status(
            context,
            store,
            "sqlite",
            (version, SQLITE_SCHEMA_VERSION),
            durability=durability,
            files=files,
        )


def _postgres_status(context: CliContext) -> StoreStatus:
    """Report this build's schema version: opening migrated to it or refused a newer one."""
    from flowvault.adapters.postgres._schema import (  # noqa: PLC0415 - an optional extra
        SCHEMA_VERSION as POSTGRES_SCHEMA_VERSION,
    )

    settings = context.settings
    durability = {
        "statement_timeout_s": _seconds(settings.postgres_statement_timeout),
        "lock_timeout_s": _seconds(settings.postgres_lock_timeout),
    }
    versions = (POSTGRES_SCHEMA_VERSION, POSTGRES_SCHEMA_VERSION)
    with opened_store(context) as store:
        return _counted_status(
            context, store, "postgres", versions, durability=durability, files={}
        )


def _status(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    del args
    settings = context.settings
    if context.is_cold_root():
        cold = StoreStatus(
            backend=settings.backend,
            home=str(settings.home),
            location=store_location(settings),
            cold_root=True,
        )
        return status_command(cold, io)
    return status_command(
        for_backend(context, postgres=_postgres_status, sqlite=_sqlite_status), io
    )
