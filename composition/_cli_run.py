"""Running one parsed ``flowvault`` verb: settings, logging, the verb's context, its errors.

Kept apart from the parser (``_cli``) so ``--help``, ``--version`` and a
usage error import none of what a verb runs.
"""

from __future__ import annotations

import argparse
import os

from flowvault.adapters.cli._io import CommandIO
from flowvault.adapters.cli._verbs import Handler, expanded
from flowvault.composition._cli_context import CommandContext
from flowvault.composition._logging import LogFormat, configure_logging
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


def _cli_log_format(fmt: LogFormat) -> LogFormat:
    """Resolve ``auto`` to readable lines: the CLI's stderr is read by people, JSON on request.

    The verb's own messages (``error:``, ``fix:``, progress) share stderr;
    JSON log lines between them would read as noise, so only an explicit
    ``FLOWVAULT_LOG_FORMAT=json`` asks for them.
    """
    return "console" if fmt == "auto" else fmt


def run_verb(args: argparse.Namespace) -> int:
    """Run the verb ``args`` chose; return its exit status (0 ok, 1 flowvault error)."""
    io = CommandIO(json_output=getattr(args, "json", False))
    handler: Handler = args.handler
    try:
        settings = settings_for(args)
        configure_logging(settings.log_level, _cli_log_format(settings.log_format))
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
