"""``flowvault init``: create a new store and its key with private permissions.

Refuses to overwrite a store; with PostgreSQL the key must come from
``FLOWVAULT_KEY``, and the memory backend has nothing to create.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from flowvault.adapters.cli._context import CliContext
from flowvault.adapters.cli._io import CommandIO
from flowvault.adapters.cli._status import store_location, store_stats
from flowvault.adapters.cli._verbs import for_backend
from flowvault.application._keys import KEY_ENV
from flowvault.domain import InvalidInput, KeyRequired

PRIVATE_DIR = 0o700


@dataclass(frozen=True, slots=True)
class InitReport:
    """What ``init`` created; never the key itself, only where it lives and its id."""

    backend: str
    home: str
    location: str
    key_file: str | None
    key_created: bool
    key_id: str


def _init_key_line(report: InitReport) -> str:
    if report.key_file is None:
        return "key: from FLOWVAULT_KEY (no key file is written)"
    verdict = "created" if report.key_created else "existing file kept"
    return f"key file: {report.key_file} ({verdict})"


def init_command(report: InitReport, io: CommandIO) -> int:
    """Print what ``init`` created; return exit status 0."""
    document = {
        "backend": report.backend,
        "home": report.home,
        "location": report.location,
        "key_file": report.key_file,
        "key_created": report.key_created,
        "key_id": report.key_id,
    }
    lines = [
        f"initialised a {report.backend} store",
        f"  home: {report.home}",
        f"  store: {report.location}",
        f"  {_init_key_line(report)}",
        f"  key id: {report.key_id}",
        "back up the key apart from the data: without it the data cannot be read",
    ]
    io.emit(document, lines)
    return 0


# -- gathering and arguments ----------------------------------------------------


def _make_private_home(home: Path) -> None:
    """Create a missing home at 0700 (``mkdir`` alone would leave it to the umask)."""
    if home.exists():
        return
    home.parent.mkdir(parents=True, exist_ok=True)
    home.mkdir(mode=PRIVATE_DIR)
    home.chmod(PRIVATE_DIR)


def _init_sqlite(context: CliContext) -> InitReport:
    settings = context.settings
    if os.path.lexists(settings.database_path):
        raise InvalidInput(
            f"a store already exists at {settings.database_path}: init never overwrites one",
            fix="use the store that is there (see 'flowvault status'), or choose another --home",
        )
    key_file = settings.key_path
    key_existed = os.path.lexists(key_file)
    _make_private_home(settings.home)
    with context.bootstrap() as services:
        key_id = services.cipher.primary_key_id
    from_env = settings.key is not None
    return InitReport(
        backend="sqlite",
        home=str(settings.home),
        location=str(settings.database_path),
        key_file=None if from_env else str(key_file),
        key_created=not from_env and not key_existed,
        key_id=key_id,
    )


def _init_postgres(context: CliContext) -> InitReport:
    settings = context.settings
    if settings.key is None and settings.key_file is None:
        raise KeyRequired(
            f"a PostgreSQL store takes its key from {KEY_ENV} (or a key file named by "
            "FLOWVAULT_KEY_FILE), the same on every host: generate one once, keep it in your "
            "secrets manager and set it before init"
        )
    with context.bootstrap() as services:
        if store_stats(services.capabilities).has_records():
            raise InvalidInput(
                f"PostgreSQL schema {settings.postgres_schema} already holds a store with data: "
                "init never overwrites one"
            )
        key_id = services.cipher.primary_key_id
    return InitReport(
        backend="postgres",
        home=str(settings.home),
        location=store_location(settings),
        key_file=None if settings.key is not None else str(settings.key_file),
        key_created=False,
        key_id=key_id,
    )


def _init(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    del args
    settings = context.settings
    if settings.backend == "memory":
        raise InvalidInput(
            "the memory backend keeps nothing, so there is nothing to init: "
            "choose FLOWVAULT_BACKEND=sqlite or postgres"
        )
    return init_command(for_backend(context, postgres=_init_postgres, sqlite=_init_sqlite), io)
