"""The ``flowvault`` command: a driving adapter, one module per verb or small verb group.

Each verb module holds its arguments, gathers facts through the services
the composition root opens for it (``CliContext``), and formats them. The
console entry point in ``flowvault.composition`` builds the parser from
``VERB_GROUPS`` and hands each verb a ``CliContext``.
"""

from flowvault.adapters.cli._context import CliContext, CliSettings, Services
from flowvault.adapters.cli._groups import VERB_GROUPS
from flowvault.adapters.cli._io import CommandIO
from flowvault.adapters.cli._verbs import EXIT_CODES, Handler, expanded

__all__ = [
    "EXIT_CODES",
    "VERB_GROUPS",
    "CliContext",
    "CliSettings",
    "CommandIO",
    "Handler",
    "Services",
    "expanded",
]
