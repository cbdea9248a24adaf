"""The real clock and id source, injected wherever use cases need them."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime


class SystemClock:
    """``Clock`` backed by the operating system's wall clock, in UTC."""

    def now(self) -> datetime:
        """Return the current instant."""
        return datetime.now(UTC)


class RandomIdFactory:
    """``IdFactory`` issuing 128-bit random identifiers as 32 hex digits."""

    def new_id(self) -> str:
        """Return a fresh identifier."""
        return secrets.token_hex(16)
