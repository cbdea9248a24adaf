"""Opt-in routing of flowvault's log events to a stream; the library itself configures nothing.

flowvault logs through standard ``logging`` under ``flowvault.*``
(``flowvault.application._observability``): a host that set up ``logging``
already receives the events, and one that did not sees nothing.
``configure_logging`` is what the CLI calls, and what a host calls to
have flowvault's events on stderr without setting up ``logging`` itself.
It touches only the ``flowvault`` logger (and quiets the pool's), never
the root logger or structlog's global configuration.
"""

from __future__ import annotations

import datetime
import logging
import sys
from typing import Any, Literal, TextIO

import structlog
from structlog.typing import EventDict

from flowvault.application._observability import ROOT_LOGGER

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


class _EventFormatter(logging.Formatter):
    """Render a flowvault event record as one JSON line, or one readable line."""

    def __init__(self, *, use_json: bool) -> None:
        super().__init__()
        self._render: Any = (
            structlog.processors.JSONRenderer(sort_keys=True)
            if use_json
            else structlog.dev.ConsoleRenderer(colors=False, pad_event_to=0)
        )

    def format(self, record: logging.LogRecord) -> str:
        event_dict: EventDict = {
            "event": getattr(record, "flowvault_event", record.getMessage()),
            **getattr(record, "flowvault_fields", {}),
            "level": record.levelname.lower(),
            "logger": record.name,
            "timestamp": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(),
        }
        rendered: str = self._render(None, record.levelname.lower(), event_dict)
        return rendered


LogFormat = Literal["auto", "json", "console"]


class _FlowvaultHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The one handler ``configure_logging`` puts on the ``flowvault`` logger."""


def configure_logging(
    level: Literal["debug", "info", "warning", "error"] = "info",
    fmt: LogFormat = "auto",
    stream: TextIO | None = None,
) -> None:
    """Write flowvault's events at ``level`` and above to ``stream`` (stderr by default).

    ``auto`` renders JSON lines when the stream is not a terminal (so log
    shippers get structure) and a readable line when it is. Calling it
    again replaces the earlier handler rather than adding one. The events
    stop at this handler (they do not also reach the root logger's), and
    the connection pool's per-attempt warnings are kept off stderr
    (``_quiet_pool_logger``).
    """
    _quiet_pool_logger()
    out = sys.stderr if stream is None else stream
    use_json = fmt == "json" or (fmt == "auto" and not out.isatty())
    logger = logging.getLogger(ROOT_LOGGER)
    for handler in list(logger.handlers):
        if isinstance(handler, _FlowvaultHandler):
            logger.removeHandler(handler)
    handler = _FlowvaultHandler(out)
    handler.setFormatter(_EventFormatter(use_json=use_json))
    logger.addHandler(handler)
    logger.setLevel(logging.getLevelNamesMapping()[level.upper()])
    logger.propagate = False
