"""The ``flowvault`` console script: parse, build services, call a command function.

It sits in the outermost ring so the command functions (``adapters/cli``)
receive services and never import the composition root.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from flowvault.adapters.cli import CommandIO, ResetRequest, reset_progress_command
from flowvault.composition._bootstrap import open_existing
from flowvault.composition._logging import configure_logging
from flowvault.composition._settings import Settings
from flowvault.domain import FlowvaultError, InvalidInput

EXIT_CODES = """exit codes:
  0  success
  1  a flowvault error (its code is printed) or a declined confirmation
  2  usage error
"""

Handler = Callable[[argparse.Namespace, Settings, CommandIO], int]


def _settings(args: argparse.Namespace) -> Settings:
    environ = dict(os.environ)
    if args.home is not None:
        environ["FLOWVAULT_HOME"] = str(Path(args.home).expanduser())
    return Settings.from_env(environ)


def _reset_progress(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    request = ResetRequest(
        scope=args.scope, actor=args.actor, reason=args.reason, dry_run=args.dry_run, yes=args.yes
    )
    runtime = open_existing(settings)
    if runtime is None:
        return reset_progress_command(None, request, io)
    with runtime:
        return reset_progress_command(runtime.state(args.scope), request, io)


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of every verb."""
    parser = argparse.ArgumentParser(
        prog="flowvault",
        description="Durable, sealed, tamper-evident workflow state.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--home", help="the flowvault home directory (default: FLOWVAULT_HOME)")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    reset = verbs.add_parser(
        "reset-progress",
        help="fingerprint a scope's workflow state and reset it",
        description=(
            "Record a workflow_state.reset event with a plaintext-free fingerprint of the "
            "scope's state, then delete only that state row. Works on a cold root, where "
            "it reports the state as absent and creates nothing."
        ),
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    reset.add_argument("--scope", required=True, help="the scope (bucket or profile) to reset")
    reset.add_argument("--actor", default="cli", help="who resets, for the audit event")
    reset.add_argument("--reason", help="a reason class such as 'corrupt' (default: derived)")
    reset.add_argument("--dry-run", action="store_true", help="print the fingerprint only")
    reset.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    reset.add_argument("--json", action="store_true", help="print one JSON document")
    reset.set_defaults(handler=_reset_progress)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one verb and return its exit status (0 ok, 1 flowvault error, 2 usage)."""
    args = build_parser().parse_args(argv)
    io = CommandIO(json_output=getattr(args, "json", False))
    handler: Handler = args.handler
    try:
        settings = _settings(args)
        configure_logging(settings.log_level, settings.log_format)
        return handler(args, settings, io)
    except FlowvaultError as error:
        return io.fail(error)
    except OSError as error:
        return io.fail(InvalidInput(f"cannot use the flowvault home: {error.strerror}"))


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
