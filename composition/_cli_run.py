"""Running one parsed ``flowvault`` verb: settings, logging, the verb's context, its errors.

Kept apart from the parser (``_cli``) so ``--help``, ``--version`` and a
usage error import none of what a verb runs.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import cast

from flowvault.adapters.cli._io import CommandIO
from flowvault.adapters.cli._verbs import Handler, expanded, resolve
from flowvault.composition._cli_context import CommandContext
from flowvault.composition._logging import LogFormat, configure_logging
from flowvault.composition._settings import Settings
from flowvault.domain import FlowvaultError, InvalidInput, StoreUnavailable


def settings_for(args: argparse.Namespace) -> Settings:
    """Build settings from ``FLOWVAULT_*``, overridden by the global options given."""
    environ = dict(os.environ)
    if args.home is not None:
        environ["FLOWVAULT_HOME"] = expanded(args.home, "--home")
    if args.backend is not None:
        environ["FLOWVAULT_BACKEND"] = args.backend
    if args.postgres_dsn is not None:
        environ["FLOWVAULT_POSTGRES_DSN"] = args.postgres_dsn
    try:
        return Settings.from_env(environ)
    except InvalidInput as error:
        if args.home is None:
            raise
        message = error.message.replace("FLOWVAULT_HOME:", "--home:")
        raise InvalidInput(message, **error.details) from None


def permission_denied(error: PermissionError, settings: Settings | None) -> FlowvaultError:
    """Name the path this user may not use, and how to give it access.

    A path of the store (its home, data or keys) is ``STORE_UNAVAILABLE``;
    any other, such as a file argument, is ``INVALID_INPUT``.
    """
    path = error.filename
    if path is None:
        return StoreUnavailable(
            "permission denied opening the flowvault home",
            fix="run flowvault as the user who owns the home, or give this user access to it",
        )
    fix = f"run flowvault as the owner of {path}, or give this user access to it (chown or chmod)"
    message = f"permission denied: {path}"
    if settings is not None and _in_store(Path(path), settings):
        return StoreUnavailable(message, path=str(path), fix=fix)
    return InvalidInput(message, path=str(path), fix=fix)


def _in_store(path: Path, settings: Settings) -> bool:
    places = (settings.home, settings.keys_dir, settings.data_dir, settings.key_path)
    return any(path == place or place in path.parents for place in places)


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
    handler = cast("Handler", resolve(args.handler))
    settings: Settings | None = None
    try:
        settings = settings_for(args)
        io.progress_interval = settings.progress_interval
        configure_logging(settings.log_level, _cli_log_format(settings.log_format))
        return handler(args, CommandContext(settings), io)
    except FlowvaultError as error:
        return io.fail(error)
    except BrokenPipeError:
        raise
    except PermissionError as error:
        return io.fail(permission_denied(error, settings))
    except OSError as error:
        return io.fail(InvalidInput(f"cannot use the flowvault home: {error.strerror}"))
    except Exception as error:
        if args.debug:
            raise
        return io.fail(InvalidInput(f"unexpected {type(error).__name__}; rerun with --debug"))
