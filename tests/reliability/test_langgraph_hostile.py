"""Hostile input to every FlowvaultSaver and GraphApprovals call: a result or a typed error.

Each call gets arguments drawn from the shared hostile strategies (text with
lone surrogates and NUL, wrong types, huge and malformed JSON, cycles) mixed
with plausible ones. A call may succeed or raise a flowvault error with a
stable code; any other exception, or an error naming the input in clear,
fails the test.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Iterator
from typing import Any

import hostile
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.checkpoint.base import empty_checkpoint

from flowvault.adapters.langgraph import FlowvaultSaver, GraphApprovals
from flowvault.composition import Runtime, Settings, bootstrap
from flowvault.domain import FlowvaultError

KEY = secrets.token_bytes(32)
TEXT = hostile.hostile_text(("t-1", "", "child:1"))
ANY = st.one_of(TEXT, hostile.hostile_json(), hostile.non_text())


def _configs() -> st.SearchStrategy[Any]:
    configurable = st.fixed_dictionaries(
        {"thread_id": st.one_of(TEXT, ANY)},
        optional={"checkpoint_ns": st.one_of(TEXT, ANY), "checkpoint_id": st.one_of(TEXT, ANY)},
    )
    return st.one_of(st.fixed_dictionaries({"configurable": configurable}), ANY)


def _checkpoint(values: Any, versions: Any, cid: Any) -> Any:
    """Shape a checkpoint as LangGraph's, with hostile values where the draw put them."""
    if values is _WHOLE:
        return cid
    checkpoint: dict[str, Any] = dict(empty_checkpoint())
    checkpoint.update(channel_values=values, channel_versions=versions, id=cid)
    return checkpoint


_WHOLE = object()
"""Drawn as ``values``: pass ``cid`` (any hostile value) as the whole checkpoint."""


Arguments = dict[str, Any]
Call = Callable[[FlowvaultSaver, GraphApprovals, Arguments], object]


def args(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[Arguments]:
    """Draw keyword arguments, as the main hostile-input table does."""
    return st.fixed_dictionaries(fields)


LISTS = st.one_of(st.lists(ANY, max_size=3), ANY)
MAPPINGS = st.one_of(st.none(), hostile.hostile_mapping(), ANY)

CALLS: dict[str, tuple[st.SearchStrategy[Arguments], Call]] = {
    "get_tuple": (args(config=_configs()), lambda s, g, a: s.get_tuple(a["config"])),
    "list": (
        args(
            config=st.one_of(st.none(), _configs()),
            filter=MAPPINGS,
            before=st.one_of(st.none(), _configs()),
            limit=st.one_of(st.none(), hostile.hostile_ints(), ANY),
        ),
        lambda s, g, a: list(
            s.list(a["config"], filter=a["filter"], before=a["before"], limit=a["limit"])
        ),
    ),
    "put": (
        args(
            config=_configs(),
            values=st.one_of(st.just(_WHOLE), MAPPINGS),
            channel_versions=MAPPINGS,
            cid=st.one_of(TEXT, ANY),
            metadata=MAPPINGS,
            versions=MAPPINGS,
        ),
        lambda s, g, a: s.put(
            a["config"],
            _checkpoint(a["values"], a["channel_versions"], a["cid"]),
            a["metadata"],
            a["versions"],
        ),
    ),
    "put_writes": (
        args(
            config=_configs(),
            writes=st.one_of(st.lists(st.tuples(TEXT, ANY), max_size=3), ANY),
            task_id=st.one_of(TEXT, ANY),
            task_path=st.one_of(TEXT, ANY),
        ),
        lambda s, g, a: s.put_writes(a["config"], a["writes"], a["task_id"], a["task_path"]),
    ),
    "delete_thread": (args(thread=ANY), lambda s, g, a: s.delete_thread(a["thread"])),
    "delete_for_runs": (args(runs=LISTS), lambda s, g, a: s.delete_for_runs(a["runs"])),
    "copy_thread": (
        args(source=ANY, target=ANY),
        lambda s, g, a: s.copy_thread(a["source"], a["target"]),
    ),
    "prune": (
        args(threads=LISTS, strategy=st.one_of(st.just("keep_latest"), ANY)),
        lambda s, g, a: s.prune(a["threads"], strategy=a["strategy"]),
    ),
    "get_next_version": (
        args(current=ANY),
        lambda s, g, a: s.get_next_version(a["current"], None),
    ),
    "aget_tuple": (
        args(config=_configs()),
        lambda s, g, a: asyncio.run(s.aget_tuple(a["config"])),
    ),
    "GraphApprovals.request": (
        args(config=_configs(), audience=st.one_of(TEXT, ANY), prompt=st.one_of(TEXT, ANY)),
        lambda s, g, a: g.request(a["config"], audience=a["audience"], prompt=a["prompt"]),
    ),
    "GraphApprovals.decide": (
        args(approval=ANY, decision=st.one_of(TEXT, ANY), actor=ANY),
        lambda s, g, a: g.decide(a["approval"], a["decision"], a["actor"]),
    ),
}


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[Runtime, FlowvaultSaver, GraphApprovals]]:
    """One memory runtime with a thread written, shared by every draw."""
    with bootstrap(Settings(backend="memory"), key=KEY) as runtime:
        saver = FlowvaultSaver.from_runtime(runtime)
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"v": 1}
        checkpoint["channel_versions"] = {"v": 1}
        config = saver.put(
            {"configurable": {"thread_id": "t-1", "checkpoint_ns": ""}}, checkpoint, {}, {"v": 1}
        )
        saver.put_writes(config, [("v", 2)], task_id="task")
        yield runtime, saver, GraphApprovals(runtime)
        saver.close()


@pytest.mark.parametrize("name", sorted(CALLS))
def test_every_call_gives_a_result_or_a_typed_error(
    name: str, world: tuple[Runtime, FlowvaultSaver, GraphApprovals]
) -> None:
    """Whatever the arguments, the call returns or raises a ``FlowvaultError``."""
    _, saver, approvals = world

    strategy, call = CALLS[name]

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(arguments=strategy)
    def check(arguments: Arguments) -> None:
        refused: FlowvaultError | None = None
        try:
            call(saver, approvals, arguments)
        except FlowvaultError as error:
            refused = error
        if refused is not None:
            assert refused.code
            assert "t-1" not in str(refused)

    check()


def test_the_table_covers_every_public_method() -> None:
    """A new public method of the saver or the approvals gets a row, or this fails."""
    saver_methods = {
        name
        for name in vars(FlowvaultSaver)
        if not name.startswith("_") and callable(getattr(FlowvaultSaver, name))
    }
    async_twins = {
        name for name in saver_methods if name.startswith("a") and name[1:] in saver_methods
    }
    without_input = {
        "setup",
        "close",
        "from_runtime",
        "from_conn_string",
        "get_delta_channel_history",
    }
    missing = saver_methods - set(CALLS) - async_twins - without_input
    approvals = {name for name in vars(GraphApprovals) if not name.startswith("_")}
    missing |= {f"GraphApprovals.{name}" for name in approvals} - set(CALLS)
    assert not missing
