"""LangGraph's checkpointer interface over flowvault: ``pip install 'flowvault[langgraph]'``.

``FlowvaultSaver`` (and ``AsyncFlowvaultSaver``, opened with ``async with``)
keeps a graph's checkpoints, channel values, task writes and metadata
sealed, with thread ids and namespaces only as keyed digests, and checks
every read against the thread's ledger stream.
"""

from flowvault.adapters.langgraph._approvals import GraphApprovals, GraphDecision
from flowvault.adapters.langgraph._saver import AsyncFlowvaultSaver, FlowvaultSaver

__all__ = ["AsyncFlowvaultSaver", "FlowvaultSaver", "GraphApprovals", "GraphDecision"]
