"""Natural keys built from several parts, joined so no part can be mistaken for two."""

from __future__ import annotations

from typing import Final

SEPARATOR: Final = "\x1f"
"""The ASCII unit separator: no id or name a service accepts contains it."""


def joined(*parts: str) -> str:
    """Return the natural key of ``parts``, in order."""
    return SEPARATOR.join(parts)
