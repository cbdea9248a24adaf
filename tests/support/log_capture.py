"""Capture flowvault's log events as dicts, the shape ``structlog.testing.capture_logs`` gave.

flowvault logs through standard ``logging`` under ``flowvault.*``; this
attaches a handler to the ``flowvault`` logger for the block and lowers
its level to ``level`` (warning by default, the level the library's
warnings are asserted at), then restores both.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class _Collector(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.entries: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "flowvault_event", None)
        if event is None:
            return
        fields = getattr(record, "flowvault_fields", {})
        self.entries.append({"event": event, **fields, "log_level": record.levelname.lower()})


@contextmanager
def capture_logs(level: int = logging.WARNING) -> Iterator[list[dict[str, Any]]]:
    """Collect every flowvault event at ``level`` or above logged inside the block."""
    logger = logging.getLogger("flowvault")
    collector = _Collector()
    before = logger.level
    logger.addHandler(collector)
    logger.setLevel(level)
    try:
        yield collector.entries
    finally:
        logger.removeHandler(collector)
        logger.setLevel(before)


SESSION_LEVEL = logging.DEBUG
"""The ``flowvault`` logger's level for a test session: every event reaches pytest's capture."""


def reset_flowvault_logging() -> None:
    """Undo ``configure_logging`` (as the CLI's in-process ``main`` calls it) after a test.

    Otherwise a later test would log into a stream pytest has already
    closed, and events would stop reaching pytest's capture (and so the
    key-leak scan).
    """
    logger = logging.getLogger("flowvault")
    for handler in list(logger.handlers):
        if type(handler).__name__ == "_FlowvaultHandler":
            logger.removeHandler(handler)
    logger.setLevel(SESSION_LEVEL)
    logger.propagate = True
