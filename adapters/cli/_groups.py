"""Every verb group of the ``flowvault`` command, in the order ``--help`` lists them."""

from __future__ import annotations

from collections.abc import Callable

from flowvault.adapters.cli import (
    _approvals,
    _demo,
    _doctor,
    _fingerprint,
    _init,
    _keys,
    _ledger,
    _move,
    _reset,
    _restore,
    _retention,
    _runs,
    _status,
    _workflows,
)
from flowvault.adapters.cli._verbs import Verbs

VERB_GROUPS: tuple[Callable[[Verbs], None], ...] = (
    _init.register,
    _status.register,
    _doctor.register,
    _restore.register,
    _workflows.register,
    _runs.register,
    _approvals.register,
    _ledger.register,
    _fingerprint.register,
    _retention.register,
    _keys.register,
    _move.register,
    _reset.register,
    _demo.register,
)
"""Each adds its verbs to the parser's ``VERB`` sub-commands."""
