"""What every verb of the ``flowvault`` command shares: its options, epilog and handler shape.

The parser imports this module, so it imports nothing a verb runs.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias, TypeVar

from flowvault.adapters._paths import check_os_path
from flowvault.adapters.cli._catalog import EXIT_CODES

if TYPE_CHECKING:
    from flowvault.adapters.cli._context import CliContext
    from flowvault.adapters.cli._io import CommandIO

T = TypeVar("T")

Handler: TypeAlias = "Callable[[argparse.Namespace, CliContext, CommandIO], int]"
Verbs: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

DEFAULT_LIMIT = 50
EVENT_LIMIT = 200
COLD_NOTE = "On a cold root it creates nothing."


def resolve(reference: str) -> Callable[..., object]:
    """Import what ``"module:name"`` names in ``flowvault.adapters.cli``."""
    module, name = reference.split(":")
    found: Callable[..., object] = getattr(
        importlib.import_module(f"flowvault.adapters.cli.{module}"), name
    )
    return found


@dataclass(frozen=True, slots=True)
class DeferredType:
    """An argument type kept beside its verb's code, imported only when a value is parsed."""

    reference: str

    def __call__(self, text: str) -> object:
        return resolve(self.reference)(text)

    def __repr__(self) -> str:
        return self.reference.split(":")[1].lstrip("_")


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
    handler: str,
) -> argparse.ArgumentParser:
    """Add one verb with the common options, the exit-code epilog and its handler.

    ``handler`` names the function as ``"module:function"``; it is imported
    when the verb runs.
    """
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
    from flowvault.domain import InvalidInput  # noqa: PLC0415 - the parser stays light

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


def verb_group(verbs: Verbs, name: str, help: str) -> Verbs:
    """Add a verb that has sub-verbs (``runs list``, ``runs show``) and return its sub-verbs."""
    group = verbs.add_parser(name, help=help, description=help)
    return group.add_subparsers(dest=f"{name}_verb", required=True, metavar="VERB")


def add_paging(parser: argparse.ArgumentParser, default: int = DEFAULT_LIMIT) -> None:
    """Add ``--limit``, ``--cursor`` and ``--all`` to a listing verb."""
    parser.add_argument(
        "--limit",
        type=int,
        default=default,
        help=f"at most this many per page (default {default}, capped at 200)",
    )
    parser.add_argument(
        "--cursor", metavar="TOKEN", help="start at this page: the next_cursor a listing printed"
    )
    parser.add_argument(
        "--all", action="store_true", help="page through every page (from --cursor on, if given)"
    )
