"""The ``flowvault`` console script: parse, build the verb's context, run the verb.

It sits in the outermost ring so the verbs (``flowvault.adapters.cli``)
receive a ``CliContext`` and never import the composition root. Each verb
group registers itself from its own module there (``VERB_GROUPS``).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence

from flowvault.adapters.cli._groups import VERB_GROUPS
from flowvault.adapters.cli._io import CommandIO
from flowvault.adapters.cli._verbs import EXIT_CODES, Handler, expanded
from flowvault.composition._cli_context import CommandContext
from flowvault.composition._logging import configure_logging
from flowvault.composition._settings import Settings
from flowvault.domain import FlowvaultError, InvalidInput


def settings_for(args: argparse.Namespace) -> Settings:
    """Build settings from ``FLOWVAULT_*``, overridden by the global options given."""
    environ = dict(os.environ)
    if args.home is not None:
        environ["FLOWVAULT_HOME"] = expanded(args.home, "--home")
    if args.backend is not None:
        environ["FLOWVAULT_BACKEND"] = args.backend
    if args.postgres_dsn is not None:
        environ["FLOWVAULT_POSTGRES_DSN"] = args.postgres_dsn
    return Settings.from_env(environ)


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
    for register in VERB_GROUPS:
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
        return handler(args, CommandContext(settings), io)
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
