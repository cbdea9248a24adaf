"""Adapters for the process environment: the system clock and random ids."""

from flowvault.adapters.system._clock import RandomIdFactory, SystemClock

__all__ = ["RandomIdFactory", "SystemClock"]
