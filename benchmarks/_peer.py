"""The peer: LangGraph's ``SqliteSaver`` with its AES-GCM ``EncryptedSerializer``.

It is what users would pick instead of flowvault to keep encrypted workflow
state in a SQLite file, so S1, S2 and S5a run the same work through it.
Every call into LangGraph is made here, behind a small typed surface, and
its packages are optional (the ``bench`` extra): without them the suite
still runs and reports the peer as not installed, with the reason.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Final

from _baseline import BUSY_TIMEOUT

try:
    from Crypto.Cipher import AES
    from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint
    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
    from langgraph.checkpoint.sqlite import SqliteSaver
except ImportError as missing:
    _PROVIDERS = {"Crypto": "pycryptodome", "langgraph": "langgraph-checkpoint-sqlite"}
    _TOP = (missing.name or "").partition(".")[0]
    _MISSING: str | None = (
        f"{_PROVIDERS.get(_TOP, _TOP or 'a peer package')} is missing ({missing}); "
        "install the bench extra"
    )
else:
    _MISSING = None

PEER_NAME: Final = "LangGraph SqliteSaver, AES-GCM"
PEER_DISTRIBUTIONS: Final = ("langgraph-checkpoint", "langgraph-checkpoint-sqlite", "pycryptodome")
CHANNEL: Final = "workflow"
"""The one channel a checkpoint holds: the workflow document."""

_NAMESPACE: Final = ""


def peer_unavailable() -> str | None:
    """Return in one line why the peer cannot run here, or ``None``."""
    return _MISSING


@cache
def peer_versions() -> dict[str, str | None]:
    """Return the installed version of each peer distribution, for the report's metadata."""
    versions: dict[str, str | None] = {}
    for name in PEER_DISTRIBUTIONS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _connect(path: Path, synchronous: str) -> sqlite3.Connection:
    """Open the saver's connection in WAL mode with ``synchronous`` set; the rest as it expects.

    The busy timeout is the raw baseline's, so concurrent writers queue in
    both instead of failing; isolation stays the module's default, since
    the saver commits each ``put`` itself.
    """
    connection = sqlite3.connect(path, timeout=BUSY_TIMEOUT, check_same_thread=False)
    mode = connection.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    connection.execute(f"PRAGMA synchronous={synchronous}")
    level = connection.execute("PRAGMA synchronous").fetchone()[0]
    expected = {"NORMAL": 1, "FULL": 2}[synchronous]
    if mode != "wal" or level != expected:
        connection.close()
        raise RuntimeError(f"peer database is not WAL/{synchronous} ({mode}, {level})")
    return connection


class PeerSaver:
    """One ``SqliteSaver`` on its own connection, encrypting every checkpoint with AES-GCM.

    Each ``put`` writes one checkpoint of a thread and commits it, as
    LangGraph does after each step of a graph; ``latest`` reads a thread's
    newest checkpoint back and decrypts it.
    """

    def __init__(self, path: Path, key: bytes, *, synchronous: str = "FULL") -> None:
        if _MISSING is not None:
            raise RuntimeError(f"the peer is not installed: {_MISSING}")
        self._connection = _connect(path, synchronous)
        serde = EncryptedSerializer.from_pycryptodome_aes(key=key, mode=AES.MODE_GCM)
        self._saver = SqliteSaver(self._connection, serde=serde)
        self._saver.setup()

    def put(
        self, thread_id: str, document: Mapping[str, object], step: int, parent: str | None
    ) -> str:
        """Write ``document`` as the thread's checkpoint after ``parent``; return its id."""
        checkpoint = create_checkpoint(empty_checkpoint(), None, step)
        checkpoint["channel_values"] = {CHANNEL: dict(document)}
        checkpoint["channel_versions"] = {CHANNEL: step + 1}
        configurable: dict[str, str] = {"thread_id": thread_id, "checkpoint_ns": _NAMESPACE}
        if parent is not None:
            configurable["checkpoint_id"] = parent
        saved = self._saver.put(
            {"configurable": configurable},
            checkpoint,
            {"source": "loop", "step": step, "parents": {}},
            {CHANNEL: step + 1},
        )
        return str(saved["configurable"]["checkpoint_id"])

    def latest(self, thread_id: str) -> Mapping[str, object] | None:
        """Return the document of the thread's newest checkpoint, or ``None`` if it has none."""
        found = self._saver.get_tuple(
            {"configurable": {"thread_id": thread_id, "checkpoint_ns": _NAMESPACE}}
        )
        if found is None:
            return None
        document = found.checkpoint["channel_values"].get(CHANNEL)
        if not isinstance(document, dict):
            return None
        return {str(key): value for key, value in document.items()}

    def checkpoint_types(self) -> list[str]:
        """Return the serialisation types of the stored checkpoints; ``+aes`` marks encrypted."""
        rows = self._connection.execute("SELECT DISTINCT type FROM checkpoints ORDER BY type")
        return [str(row[0]) for row in rows.fetchall()]

    def close(self) -> None:
        """Close the connection."""
        self._connection.close()
