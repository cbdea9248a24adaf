"""A LangGraph thread deleted by the saver, then its stream dropped on record by the host.

The saver keeps one stream per thread and leaves it when the thread is
deleted; the host drops it with ``drop_unit``. The store then opens under
the high-water mark, the audit passes, and the thread can be used again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from langgraph.checkpoint.base import Checkpoint, empty_checkpoint

from flowvault.adapters.langgraph import FlowvaultSaver
from flowvault.application import drop_unit
from flowvault.composition import Settings, bootstrap


def _config(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}


def _checkpoint(value: int) -> Checkpoint:
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"v": value}
    checkpoint["channel_versions"] = {"v": value}
    return checkpoint


def test_a_deleted_threads_stream_is_dropped_and_the_thread_starts_again(tmp_path: Path) -> None:
    """After the drop the store opens, verifies, and the thread's first put starts a new stream."""
    settings = Settings(backend="sqlite", home=tmp_path / "home", mark_sync="strict")
    with bootstrap(settings, create=True) as runtime:
        saver = FlowvaultSaver.from_runtime(runtime)
        for value in (1, 2, 3):
            saver.put(_config("gone"), _checkpoint(value), {}, {"v": value})
        saver.put(_config("kept"), _checkpoint(1), {}, {"v": 1})
        saver.delete_thread("gone")
        stream = saver._rows.thread("gone").stream
        assert runtime.store.ledger_head(stream) is not None, "the saver leaves the stream"
        runtime.store.commit(
            drop_unit(
                runtime.store,
                runtime.repository,
                stream,
                occurred_at=runtime.clock.now(),
                reason="thread_deleted",
            )
        )
        assert runtime.store.ledger_head(stream) is None
    with bootstrap(settings) as runtime:
        assert runtime.audit().run().ok
        saver = FlowvaultSaver.from_runtime(runtime)
        assert saver.get_tuple(_config("gone")) is None
        saver.put(_config("gone"), _checkpoint(7), {}, {"v": 7})
        found = saver.get_tuple(_config("gone"))
        assert found is not None
        assert found.checkpoint["channel_values"] == {"v": 7}
        head = runtime.store.ledger_head(stream)
        assert head is not None
        assert head.index == 0
    with bootstrap(settings) as runtime:
        assert runtime.audit().run().ok
