"""What FlowvaultSaver promises beyond LangGraph's conformance suite.

Large states, values stored once per version, the stale-fork guard, many
coroutines writing one thread, and deletions that leave no row behind, on a
real SQLite file (and PostgreSQL where the store's behaviour differs).
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import Checkpoint, empty_checkpoint

from flowvault.adapters.langgraph import FlowvaultSaver
from flowvault.application import Delete, StoreCapabilities, UnitOfWork, verified_events
from flowvault.composition import Settings, bootstrap
from flowvault.domain import IntegrityFailure, PayloadTooLarge, RevisionConflict

KEY = secrets.token_bytes(32)
COUNTED = ("langgraph.checkpoints", "langgraph.writes", "langgraph.blobs", "flowvault.blob-chunks")


@pytest.fixture
def saver(tmp_path: Path) -> Iterator[FlowvaultSaver]:
    """Provide a saver on a new SQLite file."""
    with FlowvaultSaver.from_conn_string(str(tmp_path / "graph.db"), key=KEY) as opened:
        yield opened


def _config(thread: str, cid: str | None = None, ns: str = "") -> dict[str, Any]:
    configurable: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ns}
    if cid is not None:
        configurable["checkpoint_id"] = cid
    return {"configurable": configurable}


def _checkpoint(values: dict[str, Any], versions: dict[str, int]) -> Checkpoint:
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = values
    checkpoint["channel_versions"] = versions
    return checkpoint


def _counts(saver: FlowvaultSaver) -> dict[str, int]:
    store = saver._rows.repository.store
    stats = StoreCapabilities.of(store).stats
    assert stats is not None
    counts = stats.namespace_counts()
    return {namespace: counts.get(namespace, 0) for namespace in COUNTED}


def _sized(saver: FlowvaultSaver, size: int) -> bytes:
    """Return bytes the saver's serializer turns into exactly ``size`` stored bytes."""
    kind, dumped = saver.serde.dumps_typed(b"x" * size)
    value = b"x" * (size - (len(kind.encode()) + 1 + len(dumped) - size))
    kind, dumped = saver.serde.dumps_typed(value)
    assert len(kind.encode()) + 1 + len(dumped) == size
    return value


def test_a_ten_mib_state_round_trips_and_unchanged_channels_are_stored_once(
    saver: FlowvaultSaver,
) -> None:
    """A 10 MiB channel is chunked; the next step stores only the small channel it changed.

    The small one is kept inside the new checkpoint's row, so no value row is added.
    """
    document = secrets.token_bytes(10 * 1024 * 1024)
    first = _checkpoint({"document": document, "step": 0}, {"document": 1, "step": 1})
    stored = saver.put(
        _config("big"), first, {"source": "loop", "step": 0}, {"document": 1, "step": 1}
    )
    after_first = _counts(saver)
    assert after_first["flowvault.blob-chunks"] == 11
    second = _checkpoint({"document": document, "step": 1}, {"document": 1, "step": 2})
    newest = saver.put(stored, second, {"source": "loop", "step": 1}, {"step": 2})
    after_second = _counts(saver)
    assert after_second == {
        **after_first,
        "langgraph.checkpoints": after_first["langgraph.checkpoints"] + 1,
    }
    for config, step in ((stored, 0), (newest, 1)):
        found = saver.get_tuple(config)
        assert found is not None
        assert found.checkpoint["channel_values"] == {"document": document, "step": step}


def test_a_checkpoint_and_its_metadata_fit_one_record_and_one_too_large_is_refused_whole(
    saver: FlowvaultSaver,
) -> None:
    """About 760 KiB of serialised checkpoint and metadata fit the 1 MiB record after base64.

    More is ``PayloadTooLarge``, and nothing of the put is stored.
    """
    kept = saver.put(_config("sized"), _checkpoint({}, {}), {"blob": "x" * (740 * 1024)}, {})
    found = saver.get_tuple(kept)
    assert found is not None
    assert len(found.metadata["blob"]) == 740 * 1024
    before = _counts(saver)
    with pytest.raises(PayloadTooLarge):
        saver.put(kept, _checkpoint({}, {}), {"blob": "x" * (800 * 1024)}, {})
    assert _counts(saver) == before
    newest = saver.get_tuple(_config("sized"))
    assert newest is not None
    assert newest.config == kept


def test_a_value_of_each_type_round_trips(saver: FlowvaultSaver) -> None:
    """Bytes, text, numbers, None and containers come back as the serializer alone returns them."""
    values = {
        "b": b"\x00\xff",
        "s": "t\u00e9xt",
        "i": 2**62,
        "f": 0.5,
        "n": None,
        "l": [1, {"k": (2, 3)}],
    }
    versions = dict.fromkeys(values, 1)
    config = saver.put(_config("types"), _checkpoint(values, versions), {}, versions)
    found = saver.get_tuple(config)
    assert found is not None
    assert found.checkpoint["channel_values"] == {
        channel: saver.serde.loads_typed(saver.serde.dumps_typed(value))
        for channel, value in values.items()
    }


def test_the_stale_fork_guard_is_off_by_default_and_refuses_when_on(tmp_path: Path) -> None:
    """Forking from an older parent is time travel by default, and a lost race with the option."""
    for refuse in (False, True):
        path = str(tmp_path / f"fork-{refuse}.db")
        with FlowvaultSaver.from_conn_string(path, key=KEY, refuse_stale_forks=refuse) as saver:
            first = saver.put(_config("t"), _checkpoint({}, {}), {}, {})
            saver.put(first, _checkpoint({}, {}), {}, {})
            if refuse:
                with pytest.raises(RevisionConflict, match="no longer the newest"):
                    saver.put(first, _checkpoint({}, {}), {}, {})
                assert len(list(saver.list(_config("t")))) == 2
            else:
                saver.put(first, _checkpoint({}, {}), {}, {})
                assert len(list(saver.list(_config("t")))) == 3


def test_a_hundred_coroutines_writing_one_thread_all_land_on_an_unforked_ledger(
    saver: FlowvaultSaver,
) -> None:
    """Each ``aput`` and ``aput_writes`` wins its compare-and-swap on the thread's stream."""

    async def one(number: int) -> None:
        config = await saver.aput(
            _config("busy"),
            _checkpoint({"n": number}, {"n": number + 1}),
            {"step": number},
            {"n": number + 1},
        )
        await saver.aput_writes(config, [("n", number)], task_id=f"task-{number}")

    async def all_of_them() -> None:
        await asyncio.gather(*(one(number) for number in range(100)))

    asyncio.run(all_of_them())
    listed = list(saver.list(_config("busy")))
    assert len(listed) == 100
    assert all(item.pending_writes and len(item.pending_writes) == 1 for item in listed)
    store = saver._rows.repository.store
    events = verified_events(store, saver._rows.thread("busy").stream, saver._rows.repository)
    assert [event.index for event in events] == list(range(200))


def test_two_savers_taking_turns_on_one_thread_each_chain_onto_the_others_events(
    tmp_path: Path,
) -> None:
    """Each saver chains onto its own last event; a stale one loses the race and rebuilds.

    When the other saver moved the thread on since, the write loses its
    compare-and-swap and is built again on the event actually there.
    """
    path = str(tmp_path / "shared.db")
    with (
        FlowvaultSaver.from_conn_string(path, key=KEY) as first,
        FlowvaultSaver.from_conn_string(path, key=KEY) as second,
    ):
        config = _config("shared")
        for step in range(6):
            saver = (first, second)[step % 2]
            config = saver.put(
                config, _checkpoint({"n": step}, {"n": step + 1}), {}, {"n": step + 1}
            )
            saver.put_writes(config, [("n", step)], task_id=f"task-{step}")
        store = first._rows.repository.store
        events = verified_events(store, first._rows.thread("shared").stream, first._rows.repository)
        assert [event.index for event in events] == list(range(12))
        found = second.get_tuple(_config("shared"))
        assert found is not None
        assert found.checkpoint["channel_values"] == {"n": 5}
        assert found.pending_writes == [("task-5", "n", 5)]


def test_deleting_a_thread_leaves_no_row_of_it(saver: FlowvaultSaver) -> None:
    """Checkpoints, task writes, values and the chunks of a large value all go."""
    big = secrets.token_bytes(3 * 1024 * 1024)
    config = saver.put(_config("gone"), _checkpoint({"big": big}, {"big": 1}), {}, {"big": 1})
    saver.put_writes(config, [("big", b"x")], task_id="task")
    saver.put(_config("kept"), _checkpoint({"small": 1}, {"small": 1}), {}, {"small": 1})
    saver.delete_thread("gone")
    assert saver.get_tuple(_config("gone")) is None
    assert _counts(saver) == {
        "langgraph.checkpoints": 1,
        "langgraph.writes": 0,
        "langgraph.blobs": 0,
        "flowvault.blob-chunks": 0,
    }
    saver.put(_config("gone"), _checkpoint({"big": b"again"}, {"big": 1}), {}, {"big": 1})
    found = saver.get_tuple(_config("gone"))
    assert found is not None
    assert found.checkpoint["channel_values"] == {"big": b"again"}


def test_prune_keeps_each_namespace_newest_and_the_values_it_names(saver: FlowvaultSaver) -> None:
    """``keep_latest`` deletes older checkpoints, their writes, and values nothing kept names."""
    parent = _config("p")
    for step in range(3):
        parent = saver.put(parent, _checkpoint({"v": step}, {"v": step + 1}), {}, {"v": step + 1})
        saver.put_writes(parent, [("v", step)], task_id="t")
    saver.prune(["p"])
    assert _counts(saver) == {
        "langgraph.checkpoints": 1,
        "langgraph.writes": 1,
        "langgraph.blobs": 0,
        "flowvault.blob-chunks": 0,
    }
    found = saver.get_tuple(_config("p"))
    assert found is not None
    assert found.checkpoint["channel_values"] == {"v": 2}
    assert found.pending_writes == [("t", "v", 2)]


def test_small_values_live_in_their_checkpoint_and_larger_ones_in_rows_of_their_own(
    saver: FlowvaultSaver,
) -> None:
    """A value of ``INLINE_BYTES`` stays inside the checkpoint; one byte more gets a row.

    An unchanged small value is carried into each child, so pruning the
    checkpoint that first held it loses nothing; an unchanged large one is
    named, not stored again, and prune keeps only the rows a kept one names.
    """
    from flowvault.adapters.langgraph._threads import INLINE_BYTES  # noqa: PLC0415

    small, large = _sized(saver, INLINE_BYTES), _sized(saver, INLINE_BYTES + 1)
    first = saver.put(
        _config("sizes"),
        _checkpoint({"small": small, "large": large, "n": 0}, {"small": 1, "large": 1, "n": 1}),
        {},
        {"small": 1, "large": 1, "n": 1},
    )
    assert _counts(saver)["langgraph.blobs"] == 1
    second = saver.put(
        first,
        _checkpoint({"small": small, "large": large, "n": 1}, {"small": 1, "large": 1, "n": 2}),
        {},
        {"n": 2},
    )
    assert _counts(saver)["langgraph.blobs"] == 1
    newer_large = _sized(saver, INLINE_BYTES + 2)
    saver.put(
        second,
        _checkpoint(
            {"small": small, "large": newer_large, "n": 2}, {"small": 1, "large": 2, "n": 3}
        ),
        {},
        {"large": 2, "n": 3},
    )
    assert _counts(saver)["langgraph.blobs"] == 2
    saver.prune(["sizes"])
    assert _counts(saver)["langgraph.blobs"] == 1
    found = saver.get_tuple(_config("sizes"))
    assert found is not None
    assert found.checkpoint["channel_values"] == {"small": small, "large": newer_large, "n": 2}


def test_reading_a_checkpoint_of_small_values_reads_no_value_row(
    saver: FlowvaultSaver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Values kept inside the checkpoint's row come with it: no read of the values' namespace."""
    config = saver.put(
        _config("inline"), _checkpoint({"a": 1, "b": "two"}, {"a": 1, "b": 1}), {}, {"a": 1, "b": 1}
    )
    store = saver._rows.repository.store
    namespaces: list[str] = []
    for name in ("load", "load_many", "peek_metadata"):
        real = getattr(store, name)

        def counted(namespace: str, *args: Any, real: Any = real, **kwargs: Any) -> Any:
            namespaces.append(namespace)
            return real(namespace, *args, **kwargs)

        monkeypatch.setattr(store, name, counted)
    for read in (config, _config("inline")):
        found = saver.get_tuple(read)
        assert found is not None
        assert found.checkpoint["channel_values"] == {"a": 1, "b": "two"}
    assert namespaces
    assert "langgraph.blobs" not in namespaces


def test_one_checkpoint_keeps_at_most_64_kib_of_values_inside_it(saver: FlowvaultSaver) -> None:
    """Sixteen values of 4 KiB fill a checkpoint's share; a seventeenth gets a row of its own."""
    from flowvault.adapters.langgraph._threads import INLINE_BYTES, INLINE_TOTAL  # noqa: PLC0415

    assert INLINE_TOTAL == 16 * INLINE_BYTES
    value = _sized(saver, INLINE_BYTES)
    values = {f"c{n:02d}": value for n in range(17)}
    versions = dict.fromkeys(values, 1)
    config = saver.put(_config("share"), _checkpoint(values, versions), {}, versions)
    assert _counts(saver)["langgraph.blobs"] == 1
    found = saver.get_tuple(config)
    assert found is not None
    assert found.checkpoint["channel_values"] == values


def test_a_channel_left_out_of_an_unchanged_checkpoint_keeps_its_parent_value(
    tmp_path: Path,
) -> None:
    """LangGraph leaves a delta channel out between snapshots; its version still names a value.

    The child, written by a saver that never saw the parent (a new process),
    holds the value the parent held at that version.
    """
    path = str(tmp_path / "delta.db")
    with FlowvaultSaver.from_conn_string(path, key=KEY) as saver:
        first = saver.put(
            _config("d"),
            _checkpoint({"snap": "base", "n": 0}, {"snap": 1, "n": 1}),
            {},
            {"snap": 1, "n": 1},
        )
    with FlowvaultSaver.from_conn_string(path, key=KEY) as saver:
        saver.put(first, _checkpoint({"n": 1}, {"snap": 1, "n": 2}), {}, {"n": 2})
        found = saver.get_tuple(_config("d"))
        assert found is not None
        assert found.checkpoint["channel_values"] == {"snap": "base", "n": 1}


def test_prune_keeps_the_newest_of_each_namespace_whatever_its_ids_hold(
    saver: FlowvaultSaver,
) -> None:
    """Checkpoint ids are the host's text; a ``|`` in one does not merge two namespaces."""
    newest: dict[str, str] = {}
    for ns, ids in (("", ["a|1", "a|2"]), ("sub", ["a|0", "b|1"])):
        parent = _config("ids", ns=ns)
        for cid in ids:
            checkpoint = _checkpoint({"v": cid}, {"v": 1})
            checkpoint["id"] = cid
            parent = saver.put(parent, checkpoint, {}, {"v": 1})
            newest[ns] = cid
    saver.prune(["ids"])
    for ns, cid in newest.items():
        listed = [
            item.config["configurable"]["checkpoint_id"]
            for item in saver.list(_config("ids", ns=ns))
        ]
        assert listed == [cid]


class _ThreadRecordingStore:
    """A memory store that notes the thread of every call, to show none runs on the loop."""

    def __init__(self) -> None:
        from flowvault.adapters.memory import InMemorySecureObjectStore  # noqa: PLC0415

        self._inner = InMemorySecureObjectStore()
        self.threads: set[int] = set()

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._inner, name)
        if not callable(found):
            return found

        def recorded(*args: Any, **kwargs: Any) -> Any:
            self.threads.add(threading.get_ident())
            return found(*args, **kwargs)

        return recorded


def test_async_methods_never_touch_the_store_on_the_event_loop() -> None:
    """Every ``a...`` method reaches the store from the saver's worker threads only."""
    store = _ThreadRecordingStore()
    with bootstrap(Settings(backend="memory"), key=KEY, store=store) as runtime:  # type: ignore[arg-type]
        saver = FlowvaultSaver.from_runtime(runtime, threads=2)
        store.threads.clear()

        async def scenario() -> int:
            loop_thread = threading.get_ident()
            config = await saver.aput(_config("a"), _checkpoint({"v": 1}, {"v": 1}), {}, {"v": 1})
            await saver.aput_writes(config, [("v", 2)], task_id="t")
            assert await saver.aget_tuple(config) is not None
            assert len([item async for item in saver.alist(_config("a"))]) == 1
            await saver.acopy_thread("a", "b")
            await saver.aprune(["b"])
            await saver.adelete_for_runs(["none"])
            await saver.adelete_thread("a")
            return loop_thread

        loop_thread = asyncio.run(scenario())
        used = set(store.threads)
        saver.close()
    assert used
    assert loop_thread not in used
    assert len(used) <= 2


def test_copying_a_thread_twice_replaces_the_copy(saver: FlowvaultSaver) -> None:
    """A second copy over the first lands, and the target shows the source as it now is."""
    config = saver.put(_config("src"), _checkpoint({"v": 1}, {"v": 1}), {}, {"v": 1})
    saver.put_writes(config, [("v", "first")], task_id="t")
    saver.copy_thread("src", "dst")
    saver.put_writes(config, [("v", "second")], task_id="u")
    saver.copy_thread("src", "dst")
    copied = saver.get_tuple(_config("dst"))
    assert copied is not None
    assert sorted(copied.pending_writes or []) == [("t", "v", "first"), ("u", "v", "second")]


def test_putting_a_checkpoint_id_again_replaces_it(saver: FlowvaultSaver) -> None:
    """A second ``put`` of the same id is a compare-and-swap on the row, not a failure."""
    first = _checkpoint({"v": 1}, {"v": 1})
    config = saver.put(_config("again"), first, {"step": 1}, {"v": 1})
    second = _checkpoint({"v": 2}, {"v": 2})
    second["id"] = first["id"]
    assert saver.put(_config("again"), second, {"step": 2}, {"v": 2}) == config
    found = saver.get_tuple(config)
    assert found is not None
    assert found.checkpoint["channel_values"] == {"v": 2}
    assert found.metadata["step"] == 2
    assert len(list(saver.list(_config("again")))) == 1


def test_a_text_metadata_filter_is_answered_by_tags_and_stays_exact(saver: FlowvaultSaver) -> None:
    """Text values are tags the store selects by; other values, and untagged rows, are compared."""
    parent = _config("tagged")
    for step in range(6):
        metadata = {"source": "input" if step % 3 == 0 else "loop", "step": step}
        parent = saver.put(
            parent, _checkpoint({"v": step}, {"v": step + 1}), metadata, {"v": step + 1}
        )
    store = saver._rows.repository.store
    stored = store.peek_metadata(
        "langgraph.checkpoints",
        saver._rows.checkpoint_digest(
            saver._rows.thread("tagged"), "", parent["configurable"]["checkpoint_id"]
        ),
    )
    assert stored is not None
    assert len(stored.tags) == 1  # "source" is text; "step" is a number
    steps = [
        item.metadata["step"] for item in saver.list(_config("tagged"), filter={"source": "input"})
    ]
    assert steps == [3, 0]
    both = saver.list(_config("tagged"), filter={"source": "loop", "step": 4})
    assert [item.metadata["step"] for item in both] == [4]
    crowded = {f"key_{number:02d}": "text" for number in range(40)}
    saver.put(parent, _checkpoint({}, {}), {**crowded, "source": "input", "step": 9}, {})
    assert [
        item.metadata["step"] for item in saver.list(_config("tagged"), filter={"source": "input"})
    ] == [9, 3, 0]


def test_a_store_sealed_under_another_key_is_refused_at_open(tmp_path: Path) -> None:
    """``from_conn_string`` with the wrong key fails at once, before any read or write."""
    path = str(tmp_path / "keyed.db")
    with FlowvaultSaver.from_conn_string(path, key=KEY) as saver:
        saver.put(_config("k"), _checkpoint({"v": 1}, {"v": 1}), {}, {"v": 1})
    with (
        pytest.raises(IntegrityFailure, match="key does not match"),
        FlowvaultSaver.from_conn_string(path, key=secrets.token_bytes(32)),
    ):
        pass


def test_a_limited_listing_refuses_a_gap_inside_the_window_it_read(saver: FlowvaultSaver) -> None:
    """A checkpoint deleted outside flowvault in the window read is refused; further back, not."""
    config = _config("window")
    ids = []
    for step in range(5):
        config = saver.put(config, _checkpoint({"v": step}, {"v": step + 1}), {}, {"v": step + 1})
        ids.append(config["configurable"]["checkpoint_id"])
    rows = saver._rows
    store = rows.repository.store
    digest = rows.checkpoint_digest(rows.thread("window"), "", ids[2])
    stored = store.peek_metadata("langgraph.checkpoints", digest)
    assert stored is not None
    store.commit(UnitOfWork(deletes=[Delete("langgraph.checkpoints", digest, stored.revision)]))
    assert len(list(saver.list(_config("window"), limit=2))) == 2
    with pytest.raises(IntegrityFailure, match="missing"):
        list(saver.list(_config("window"), limit=3))
