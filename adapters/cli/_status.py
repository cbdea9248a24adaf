"""``flowvault status``: a store's schema version, keys, counts, files and durability.

Reads no sealed payload and needs no key; on a cold root it says so and
creates nothing. The status (and ``doctor``) open the store alone, with no
cipher, so they never resolve (so never create) a key.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from flowvault.adapters.cli._catalog import verb_help
from flowvault.adapters.cli._context import CliContext, CliSettings
from flowvault.adapters.cli._io import CommandIO, fields_document
from flowvault.adapters.cli._verbs import Verbs, add_verb, for_backend
from flowvault.adapters.sqlite._doctor import probe_database
from flowvault.adapters.sqlite._schema import SCHEMA_VERSION as SQLITE_SCHEMA_VERSION
from flowvault.application import SecureObjectStore, StoreCapabilities, StoreStats
from flowvault.domain import StoreUnavailable


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
    durability: Mapping[str, str] = field(default_factory=dict)


def _status_lines(status: StoreStatus) -> list[str]:
    lines = [f"backend: {status.backend}", f"home: {status.home}", f"store: {status.location}"]
    if status.cold_root:
        return [*lines, "cold root: no store exists here; nothing was created"]
    lines.append(
        f"schema version: {status.schema_version} "
        f"(this flowvault writes {status.supported_schema_version})"
    )
    lines += [f"{name}: {value}" for name, value in status.durability.items()]
    return lines


def _size(size: int | None) -> str:
    return "absent" if size is None else f"{size} bytes"


def _counts(io: CommandIO, title: str, column: str, counts: Mapping[str, int]) -> None:
    if counts:
        io.table(title, [column, "records"], sorted(counts.items()))
    else:
        io.say(f"{title}: none")


def status_command(status: StoreStatus, io: CommandIO) -> int:
    """Print the store's status (or that the root is cold); return exit status 0."""
    io.emit(fields_document(status), _status_lines(status))
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
    store: SecureObjectStore,
    settings: CliSettings,
    backend: str,
    versions: tuple[int | None, int],
    *,
    durability: Mapping[str, str],
    files: Mapping[str, int | None],
) -> StoreStatus:
    """Build a backend's status around the counts every backend shows, read from its open store.

    ``versions`` is the schema version the store records, then the one this build writes.
    """
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
    )


def _sqlite_status(context: CliContext) -> StoreStatus:
    """Sizes are taken before the store opens, so they show the files at rest."""
    settings = context.settings
    files = _file_sizes(settings)
    durability = {
        "synchronous": settings.synchronous,
        "busy timeout": f"{settings.busy_timeout:g} s",
    }
    with (
        opened_store(context) as store,
        probe_database(settings.database_path, settings.busy_timeout) as probe,
    ):
        version = probe.schema_version()
        return _counted_status(
            store,
            settings,
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
        "statement timeout": f"{settings.postgres_statement_timeout:g} s",
        "lock timeout": f"{settings.postgres_lock_timeout:g} s",
    }
    versions = (POSTGRES_SCHEMA_VERSION, POSTGRES_SCHEMA_VERSION)
    with opened_store(context) as store:
        return _counted_status(
            store, settings, "postgres", versions, durability=durability, files={}
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


def register(verbs: Verbs) -> None:
    """Add ``status`` to the parser."""
    add_verb(
        verbs,
        "status",
        help=verb_help("status"),
        description=(
            "Show the backend, home, schema version, key ids in use, records per namespace, "
            "file sizes and durability settings. Reads no sealed payload and needs no key. "
            "On a cold root it says so, creates nothing and exits 0."
        ),
        handler=_status,
    )
