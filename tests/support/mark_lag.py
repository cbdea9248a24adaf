"""The high-water mark as a lagging writer leaves it: behind the store, then caught up.

By default the mark is written in the background, a window behind the
commits; tests that attack the store after that window wait for it here
(the background thread writing it, not the test), and the crash families
ask whether the mark a killed or cut runtime left trailed the store.
"""

from __future__ import annotations

import time

from flowvault.adapters.system import MarkFileStore
from flowvault.application import StoreEpoch
from flowvault.application._audit import list_all_streams
from flowvault.application._mark_flusher import MARK_LAG_WINDOW
from flowvault.application._mark_format import MarkState, parse_mark, replay_log
from flowvault.composition import Runtime

SETTLE_TIMEOUT = 30.0
"""Seconds to wait for the background write: far beyond the window, for a loaded machine."""


def mark_trailed(left: MarkState | None, runtime: Runtime) -> bool:
    """Whether ``left`` (the mark read before ``runtime`` reopened) counted fewer commits.

    The reopen checked the store against that mark and did not refuse it:
    a mark may trail the store after a crash, never lead it.
    """
    store = runtime.store
    assert isinstance(store, StoreEpoch)
    if left is None:
        return store.epoch() > 0
    return parse_mark(left.head, runtime.repository, "").epoch < store.epoch()


def caught_up(runtime: Runtime) -> bool:
    """Whether the mark counts every commit and every event the store holds."""
    path = runtime.settings.high_water_path
    store = runtime.store
    assert path is not None
    assert isinstance(store, StoreEpoch)
    state = MarkFileStore(path).read()
    if state is None:
        return False
    mark = parse_mark(state.head, runtime.repository, "")
    sizes = replay_log(mark, state.log(), runtime.repository, "")
    for stream in list_all_streams(store):
        head = store.ledger_head(stream)
        if head is not None and sizes.get(stream, 0) < head.index + 1:
            return False
    return mark.epoch >= store.epoch()


def settle(runtime: Runtime) -> None:
    """Wait for the background write to bring the mark up to the store; fail after a long while."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while not caught_up(runtime):
        assert time.monotonic() < deadline, f"the mark did not catch up in {SETTLE_TIMEOUT} s"
        time.sleep(MARK_LAG_WINDOW / 2)
