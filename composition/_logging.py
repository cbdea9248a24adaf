"""Opt-in structlog configuration for the CLI; the library itself never configures logging."""

from __future__ import annotations

import logging
import sys
from typing import Literal, TextIO

import structlog
from structlog.typing import EventDict, WrappedLogger

from flowvault.domain._sanitise import REDACTED, is_secret_key

_POOL_LOGGER = "psycopg.pool"
"""psycopg_pool's logger: it warns once per failed connection attempt, with libpq's text."""


def _quiet_pool_logger() -> None:
    """Keep the pool's warnings off stderr unless the host routes them somewhere itself.

    With no handler anywhere on its path, Python prints a warning through
    its last-resort stderr handler; a ``NullHandler`` on the pool's logger
    stops only that. The records still propagate, so a handler the host
    put on the root logger sees them. flowvault reports the cause itself,
    once, as ``STORE_UNAVAILABLE``.
    """
    pool = logging.getLogger(_POOL_LOGGER)
    if not any(isinstance(handler, logging.NullHandler) for handler in pool.handlers):
        pool.addHandler(logging.NullHandler())


def redact_secret_keys(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """Blank values bound under secret-looking keys, a net under careless call sites."""
    for key in event_dict:
        if key != "event" and is_secret_key(key):
            event_dict[key] = REDACTED
    return event_dict


def configure_logging(
    level: Literal["debug", "info", "warning", "error"] = "info",
    fmt: Literal["auto", "json", "console"] = "auto",
    stream: TextIO | None = None,
) -> None:
    """Route structlog to ``stream`` (stderr by default) at ``level``.

    ``auto`` renders JSON lines when the stream is not a terminal (so log
    shippers get structure) and a readable console format when it is.
    The connection pool's per-attempt warnings are kept off stderr
    (``_quiet_pool_logger``).
    """
    _quiet_pool_logger()
    out = sys.stderr if stream is None else stream
    use_json = fmt == "json" or (fmt == "auto" and not out.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer(sort_keys=True)
        if use_json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            redact_secret_keys,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
