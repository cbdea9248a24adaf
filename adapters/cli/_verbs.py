"""What every verb of the ``flowvault`` command shares: its options, epilog and handler shape."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TypeAlias, TypeVar

from flowvault.adapters._paths import check_os_path
from flowvault.adapters.cli._catalog import EXIT_CODES
from flowvault.adapters.cli._context import CliContext
from flowvault.adapters.cli._io import CommandIO
from flowvault.domain import InvalidInput

T = TypeVar("T")

Handler: TypeAlias = Callable[[argparse.Namespace, CliContext, CommandIO], int]
Verbs: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def common_options() -> argparse.ArgumentParser:
    """Options every verb accepts (pass as ``parents=[...]``)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON document")
    return common


def add_verb(
    verbs: Verbs,
    name: str,
    *,
    help: str,
    description: str,
    handler: Handler,
) -> argparse.ArgumentParser:
    """Add one verb with the common options, the exit-code epilog and its handler."""
    parser = verbs.add_parser(
        name,
        help=help,
        description=description,
        epilog=EXIT_CODES,
        parents=[common_options()],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(handler=handler)
    return parser


def for_backend(
    context: CliContext,
    *,
    postgres: Callable[[CliContext], T],
    sqlite: Callable[[CliContext], T],
) -> T:
    """Gather what a verb reports the PostgreSQL or the SQLite way, as the settings choose."""
    if context.settings.backend == "postgres":
        return postgres(context)
    return sqlite(context)


def expanded(path: str, option: str) -> str:
    """Expand a leading ``~``; a user that does not exist, or unusable text, is ``InvalidInput``."""
    try:
        return str(Path(path).expanduser())
    except (RuntimeError, ValueError):
        raise InvalidInput(f"{option} names a home directory that cannot be found") from None


def file_path(text: str) -> Path:
    """Parse a file option: expand ``~`` and refuse text no file operation could take."""
    try:
        return check_os_path(Path(text).expanduser())
    except (RuntimeError, ValueError) as error:
        raise argparse.ArgumentTypeError(f"not a usable path: {error}") from None
