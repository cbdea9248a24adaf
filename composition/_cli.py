"""The ``flowvault`` console script: parse, build services, call a command function.

It sits in the outermost ring so the command functions (``adapters/cli``)
receive services and never import the composition root. Each group of
verbs registers itself from its own ``_cli_*`` module.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable, Sequence

from flowvault.adapters.cli import CommandIO, ResetRequest, reset_progress_command
from flowvault.composition import _cli_browse, _cli_demo, _cli_keys, _cli_ledger, _cli_store
from flowvault.composition._bootstrap import open_existing
from flowvault.composition._cli_base import EXIT_CODES, Handler, Verbs, add_verb, settings_for
from flowvault.composition._logging import configure_logging
from flowvault.composition._settings import Settings
from flowvault.domain import FlowvaultError, InvalidInput


def _reset_progress(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    request = ResetRequest(
        scope=args.scope, actor=args.actor, reason=args.reason, dry_run=args.dry_run, yes=args.yes
    )
    runtime = open_existing(settings)
    if runtime is None:
        return reset_progress_command(None, request, io)
    with runtime:
        return reset_progress_command(runtime.state(args.scope), request, io)


def _register_reset(verbs: Verbs) -> None:
    reset = add_verb(
        verbs,
        "reset-progress",
        help="fingerprint a scope's workflow state and reset it",
        description=(
            "Record a workflow_state.reset event with a plaintext-free fingerprint of the "
            "scope's state, then delete only that state row. Works on a cold root, where "
            "it reports the state as absent and creates nothing."
        ),
        handler=_reset_progress,
    )
    reset.add_argument("--scope", required=True, help="the scope (bucket or profile) to reset")
    reset.add_argument("--actor", default="cli", help="who resets, for the audit event")
    reset.add_argument("--reason", help="a reason class such as 'corrupt' (default: derived)")
    reset.add_argument("--dry-run", action="store_true", help="print the fingerprint only")
    reset.add_argument("--yes", action="store_true", help="do not ask for confirmation")


REGISTRARS: tuple[Callable[[Verbs], None], ...] = (
    _cli_store.register,
    _cli_browse.register,
    _cli_ledger.register,
    _cli_keys.register,
    _register_reset,
    _cli_demo.register,
)
"""Every verb group, in the order ``--help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of every verb."""
    parser = argparse.ArgumentParser(
        prog="flowvault",
        description="Durable, sealed, tamper-evident workflow state.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--home", help="the flowvault home directory (FLOWVAULT_HOME)")
    parser.add_argument(
        "--backend", choices=["sqlite", "postgres", "memory"], help="FLOWVAULT_BACKEND"
    )
    parser.add_argument(
        "--postgres-dsn", help="FLOWVAULT_POSTGRES_DSN (prefer the variable: argv is visible)"
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks of crashes")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for register in REGISTRARS:
        register(verbs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one verb and return its exit status (0 ok, 1 flowvault error, 2 usage)."""
    args = build_parser().parse_args(argv)
    io = CommandIO(json_output=getattr(args, "json", False))
    handler: Handler = args.handler
    try:
        settings = settings_for(args)
        configure_logging(settings.log_level, settings.log_format)
        return handler(args, settings, io)
    except FlowvaultError as error:
        return io.fail(error)
    except BrokenPipeError:
        raise
    except OSError as error:
        return io.fail(InvalidInput(f"cannot use the flowvault home: {error.strerror}"))
    except Exception as error:
        if args.debug:
            raise
        return io.fail(InvalidInput(f"unexpected {type(error).__name__}; rerun with --debug"))


EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE
"""What a shell reports for a writer whose reader stopped early, as for ``yes | head``."""


def run() -> None:
    """Console-script entry point.

    A reader that stops early (``flowvault workflows list | head``) closes
    the pipe: the rest of the output is dropped without a traceback, and
    the exit status is that of a process ended by SIGPIPE. Stdout is pointed
    at the null device first, so the interpreter's own flush at exit cannot
    fail again.
    """
    try:
        status = main()
        sys.stdout.flush()
    except BrokenPipeError:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        sys.exit(EXIT_BROKEN_PIPE)
    sys.exit(status)
