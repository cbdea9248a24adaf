"""The ``flowvault`` command: a driving adapter, one module per verb or small verb group.

Each verb module holds its arguments, gathers facts through the services
the composition root opens for it (``CliContext``), and formats them. The
console entry point in ``flowvault.composition`` builds the parser from
``VERB_GROUPS`` and hands each verb a ``CliContext``. That seam is between
this package and the composition root alone, so nothing here is exported:
hosts drive flowvault through its services, not through the command.
"""

__all__: list[str] = []
