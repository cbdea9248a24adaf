"""The ``flowvault`` verbs demo: the main job, an approval workflow narrated end to end."""

from __future__ import annotations

from flowvault.composition._cli_base import Verbs


def register(verbs: Verbs) -> None:
    """Add this group's verbs to the parser."""
    del verbs
