"""Compaction after a unit of work has already landed.

Scrubs, purges and deletions compact the store so the old sealed bytes
leave the file and its log. That step runs after the commit: if it fails,
the unit is durable all the same, so the call still succeeds, and the
stale bytes go at the next compaction (any later scrub, ``purge`` or
``compact``). Reporting the failure as the call's error would tell the
caller a durable change had not happened, and its retry would conflict.
"""

from __future__ import annotations

from flowvault.application import _observability as observe
from flowvault.application._capabilities import StoreCapabilities
from flowvault.application.ports import Compactor
from flowvault.domain import StoreBusy, StoreUnavailable

_log = observe.EventLog("flowvault.compaction")


def compact_after_commit(compactor: Compactor | None) -> bool:
    """Compact if the store can; return ``False`` (and log why) if it could not finish."""
    if compactor is None:
        return True
    try:
        completed = compactor.compact()
    except (StoreBusy, StoreUnavailable) as exc:
        _log.warning("compaction_deferred", code=exc.code)
        return False
    observe.compacted(explicit=False, completed=completed)
    return completed


def compact_fully(capabilities: StoreCapabilities) -> bool:
    """Rebuild the store's files if it can, else compact them; return whether it completed.

    The explicit ``flowvault compact``: unlike ``compact_after_commit`` it
    lets a busy store's error through, because an operator asked for it and
    should hear that it did not happen.
    """
    if capabilities.vacuumer is not None:
        completed = capabilities.vacuumer.vacuum()
    elif capabilities.compactor is not None:
        completed = capabilities.compactor.compact()
    else:
        return True
    observe.compacted(explicit=True, completed=completed)
    return completed
