"""The durability contract: what a store acknowledged survives a killed process.

A child process commits units one at a time and reports each acknowledged
one; the test SIGKILLs it at a seeded moment, reopens the store and checks
that every acknowledged unit is there whole and no unit is there in part.
It proves that ``commit`` returns only once the unit is stored atomically
and that reopening finds it; it cannot prove survival of power loss or of
an operating system crash, which only lose what the disk had not flushed.
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from flowvault.application import SecureObjectStore
from flowvault.application.testing import _durability_worker as worker
from flowvault.domain import LedgerEvent
from flowvault.domain._envelope import natural_key_digest

_WORKER = "flowvault.application.testing._durability_worker"
_ROUND_TIMEOUT = 60.0
"""Seconds a child may take to open the store and reach its kill point."""


class DurabilityContract(ABC):
    """Acknowledged units survive SIGKILL whole; closed stores reopen with everything.

    ``store_factory`` names a callable the child process imports and calls
    with JSON keyword arguments to open the test's store; ``open_store``
    opens that same store in the test process. Both are called once per
    test, ``store_factory`` first, so it may create the location (a file
    path under ``self.tmp_path``, a fresh schema). ``discard_store`` runs
    after the test. The child inherits the test process's ``sys.path``, so a
    factory importable by the test is importable by the child.
    """

    tmp_path: Path
    seed = 24
    """Seeds the units' contents and the kill moments, so every run is the same."""
    kills = 4
    """Child processes killed per test; each continues from what the last left."""

    @abstractmethod
    def store_factory(self) -> tuple[str, Mapping[str, Any]]:
        """Return ``"package.module:callable"`` and the JSON keyword arguments opening the store."""

    @abstractmethod
    def open_store(self) -> SecureObjectStore:
        """Open, in this process, the store ``store_factory`` names."""

    def discard_store(self) -> None:  # noqa: B027 - optional hook, nothing to do by default
        """Remove the store after a test; by default nothing (``tmp_path`` goes anyway)."""

    def test_acknowledged_units_survive_sigkill_whole(self, tmp_path: Path) -> None:
        """After each kill every acknowledged unit is there whole, and no unit is there in part."""
        self.tmp_path = tmp_path
        factory, kwargs = self.store_factory()
        rng = random.Random(self.seed)  # noqa: S311 - reproducible kill moments
        try:
            present, acked = 0, -1
            for round_ in range(self.kills):
                wanted = rng.randrange(1, 8)
                delay = rng.choice((0.0, rng.uniform(0.0, 0.004)))
                last = self._run_and_kill(factory, kwargs, present, wanted, delay)
                acked = max(acked, last)
                store = self.open_store()
                try:
                    present = _check(store, self.seed, acked, context=f"after kill {round_ + 1}")
                finally:
                    store.close()
        finally:
            self.discard_store()

    def test_a_closed_store_reopens_with_every_unit(self, tmp_path: Path) -> None:
        """Units committed before ``close()`` are all there when the store is opened again."""
        self.tmp_path = tmp_path
        self.store_factory()
        try:
            store = self.open_store()
            previous = None
            units = 5
            try:
                for unit in range(units):
                    work = worker.build_unit(self.seed, unit, previous)
                    store.commit(work)
                    previous = work.appends[0]
            finally:
                store.close()
            reopened = self.open_store()
            try:
                assert _check(reopened, self.seed, units - 1, context="after close") == units
            finally:
                reopened.close()
        finally:
            self.discard_store()

    def _run_and_kill(
        self, factory: str, kwargs: Mapping[str, Any], start: int, wanted: int, delay: float
    ) -> int:
        """Start a writer at unit ``start``; kill it ``delay`` seconds after ``wanted`` acks.

        Returns the last unit it acknowledged (``start - 1`` if none).
        """
        request = json.dumps(
            {"factory": factory, "kwargs": dict(kwargs), "seed": self.seed, "start": start}
        )
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path for path in sys.path if path))
        errors = self.tmp_path / f"durability-worker-{start}.err"
        with errors.open("wb") as stderr:
            child = subprocess.Popen(  # noqa: S603 - this interpreter, the kit's own worker
                [sys.executable, "-m", _WORKER, request],
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=env,
            )
        assert child.stdout is not None
        last, buffered = start - 1, b""
        try:
            deadline = time.monotonic() + _ROUND_TIMEOUT
            while last - start + 1 < wanted:
                remaining = deadline - time.monotonic()
                readable, _, _ = select.select([child.stdout], [], [], max(remaining, 0.0))
                if not readable:
                    pytest.fail(f"the writer acknowledged nothing for {_ROUND_TIMEOUT:.0f}s")
                chunk = os.read(child.stdout.fileno(), 4096)
                if not chunk:
                    child.wait()
                    detail = errors.read_text(errors="replace")[-2000:]
                    code = child.returncode
                    pytest.fail(f"the writer exited ({code}) before its kill:\n{detail}")
                buffered += chunk
                lines = buffered.split(b"\n")
                if len(lines) > 1:
                    last = int(lines[-2].decode().removeprefix("acked "))
            if delay:
                time.sleep(delay)
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
            # Acks written after the last read are still in the pipe, and count.
            buffered += child.stdout.read()
            child.stdout.close()
        for line in buffered.split(b"\n")[:-1]:
            last = int(line.decode().removeprefix("acked "))
        return last


def _check(store: SecureObjectStore, seed: int, acked: int, *, context: str) -> int:
    """Assert units ``0..acked`` are whole, later ones whole or absent; return the count there."""
    events: list[LedgerEvent] = []
    page = store.read_ledger(worker.STREAM)
    events.extend(page.events)
    while page.next_index is not None:
        page = store.read_ledger(worker.STREAM, from_index=page.next_index)
        events.extend(page.events)
    tally = store.load(worker.NAMESPACE, natural_key_digest(worker.NAMESPACE, worker.TALLY))
    tally_revision = 0 if tally is None else tally.metadata.header.revision
    present = 0
    previous = None
    for unit in range(acked + 4):
        expected = worker.build_unit(seed, unit, previous)
        previous = expected.appends[0]
        pieces: dict[str, bool] = {}
        for upsert in expected.upserts[: worker.PARTS]:
            stored = store.load(worker.NAMESPACE, upsert.header.key_digest)
            if stored is not None:
                assert stored.payload == upsert.payload, (context, unit, "payload changed")
                assert stored.metadata == upsert.metadata, (context, unit, "metadata changed")
            pieces[f"record {upsert.header.key_digest[:12]}"] = stored is not None
        if unit < len(events):
            assert events[unit] == expected.appends[0], (context, unit, "event changed")
        pieces["ledger event"] = unit < len(events)
        pieces["tally revision"] = tally_revision > unit
        held = [name for name, there in pieces.items() if there]
        assert len(held) in (0, len(pieces)), (
            f"{context}: unit {unit} is there in part: only {held} of {sorted(pieces)}"
        )
        if held:
            assert unit == present, f"{context}: unit {unit} is there but unit {present} is not"
            present += 1
        else:
            assert unit > acked, f"{context}: unit {unit} was acknowledged but is missing"
    assert present <= acked + 2, f"{context}: units beyond the one in flight are there"
    if tally is not None:
        assert tally.payload == f"{seed}:{present - 1}".encode(), (context, "tally payload")
    return present
