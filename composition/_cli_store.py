"""The ``flowvault`` verbs init, status and doctor: create a store and check its health."""

from __future__ import annotations

from flowvault.composition._cli_base import Verbs


def register(verbs: Verbs) -> None:
    """Add this group's verbs to the parser."""
    del verbs
