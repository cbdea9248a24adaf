"""The ``flowvault`` verbs ledger verify and head, fingerprint and purge: audit and retention."""

from __future__ import annotations

from flowvault.composition._cli_base import Verbs


def register(verbs: Verbs) -> None:
    """Add this group's verbs to the parser."""
    del verbs
