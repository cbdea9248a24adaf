"""Adapters for the process environment: the clock, random ids, the high-water mark file."""

from flowvault.adapters.system._clock import RandomIdFactory, SystemClock
from flowvault.adapters.system._mark_file import MarkFileStore

__all__ = [
    "MarkFileStore",
    "RandomIdFactory",
    "SystemClock",
]
