"""The refund graph of docs/langgraph.md, run by a worker that keeps running after the pause.

``python refund_graph.py start`` runs the graph to its ``interrupt()``, prints
``paused`` and then waits, like a server that keeps serving, until it is
killed; ``python refund_graph.py resume DECISION`` resumes the thread in a
new process with ``Command(resume=DECISION)`` and prints the final state.
The store is the one ``FLOWVAULT_HOME`` names.
"""

from __future__ import annotations

import json
import sys
import time
from typing import TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from flowvault.adapters.langgraph import FlowvaultSaver
from flowvault.composition import Settings, bootstrap


class Refund(TypedDict, total=False):
    order: str
    plan: str
    approved: bool
    result: str


def draft(state: Refund) -> Refund:
    """Plan the refund."""
    return {"plan": f"refund order {state['order']} in full"}


def approve(state: Refund) -> Refund:
    """Wait for a person's decision on the plan."""
    decision = interrupt({"plan": state["plan"]})
    return {"approved": decision == "approve"}


def act(state: Refund) -> Refund:
    """Carry out the decision."""
    return {"result": "refunded" if state["approved"] else "declined"}


def build() -> StateGraph[Refund]:
    """Return the three-node graph, not yet compiled."""
    builder = StateGraph(Refund)
    builder.add_node("draft", draft)
    builder.add_node("approve", approve)
    builder.add_node("act", act)
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "approve")
    builder.add_edge("approve", "act")
    builder.add_edge("act", END)
    return builder


def main() -> None:
    """Start the graph and wait to be killed, or resume it with a decision."""
    config = {"configurable": {"thread_id": "refund-1042"}}
    with bootstrap(Settings.from_env(), create=True) as runtime:
        graph = build().compile(checkpointer=FlowvaultSaver.from_runtime(runtime))
        if sys.argv[1] == "start":
            graph.invoke({"order": "1042"}, config)
            print("paused", flush=True)
            time.sleep(600)
        else:
            state = graph.invoke(Command(resume=sys.argv[2]), config)
            print(json.dumps(state, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
