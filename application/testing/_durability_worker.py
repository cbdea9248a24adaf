"""The writer a ``DurabilityContract`` test runs in a child process and kills.

Usage: ``python -m flowvault.application.testing._durability_worker REQUEST``,
where ``REQUEST`` is a JSON object: ``factory`` (``"package.module:callable"``,
dotted attributes allowed after the colon), ``kwargs`` (its JSON keyword
arguments), ``seed`` and ``start`` (the first unit to write). The child opens
the store, then commits units ``start``, ``start + 1``, ... one at a time and,
after each ``commit`` returns, writes ``acked N`` to stdout in one ``os.write``
so a line shorter than ``PIPE_BUF`` is either wholly in the pipe or not at all
when the child is killed. It never stops on its own.

The units are built here, from the seed and the unit number alone, so the
test process rebuilds exactly what the child wrote.
"""

from __future__ import annotations

import importlib
import json
import os
import random
import sys
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from flowvault.application import Guard, SecureObjectStore, UnitOfWork
from flowvault.application.testing._fakes import EPOCH, make_event, make_upsert
from flowvault.domain import LedgerEvent

NAMESPACE = "durability"
STREAM = "durability"
TALLY = "tally"
PARTS = 3
"""Records each unit creates, besides advancing the tally record and appending an event."""


def part_key(unit: int, part: int) -> str:
    """Return the natural key of one record a unit creates."""
    return f"unit-{unit}/part-{part}"


def events(seed: int, count: int) -> list[LedgerEvent]:
    """Return the first ``count`` events of the stream, each chained onto the one before."""
    chain: list[LedgerEvent] = []
    for unit in range(count):
        previous = chain[-1] if chain else None
        chain.append(
            make_event(
                STREAM,
                unit,
                previous,
                payload={"unit": unit, "seed": seed},
                occurred_at=EPOCH + timedelta(seconds=unit),
            )
        )
    return chain


def build_unit(seed: int, unit: int, previous: LedgerEvent | None) -> UnitOfWork:
    """Build unit ``unit``: ``PARTS`` new records, the tally at revision ``unit + 1``, an event."""
    rng = random.Random(f"{seed}:{unit}")  # noqa: S311 - reproducible contents
    written_at = EPOCH + timedelta(seconds=unit)
    upserts = [
        make_upsert(
            NAMESPACE,
            part_key(unit, part),
            rng.randbytes(rng.randrange(16, 256)),
            labels={"unit": unit, "part": part},
            written_at=written_at + timedelta(microseconds=part),
        )
        for part in range(PARTS)
    ]
    upserts.append(
        make_upsert(
            NAMESPACE,
            TALLY,
            f"{seed}:{unit}".encode(),
            expected=Guard.ABSENT if unit == 0 else unit,
            written_at=written_at,
        )
    )
    event = make_event(
        STREAM,
        unit,
        previous,
        payload={"unit": unit, "seed": seed},
        occurred_at=written_at,
    )
    return UnitOfWork(upserts=upserts, appends=[event])


def open_from(factory: str, kwargs: Mapping[str, Any]) -> SecureObjectStore:
    """Call the ``"package.module:callable"`` factory with ``kwargs``."""
    module_name, _, attribute = factory.partition(":")
    target: Any = importlib.import_module(module_name)
    for name in attribute.split("."):
        target = getattr(target, name)
    store: SecureObjectStore = target(**kwargs)
    return store


def main(argv: list[str]) -> None:
    """Open the store and write units until killed."""
    request = json.loads(argv[1])
    seed, start = int(request["seed"]), int(request["start"])
    store = open_from(request["factory"], request["kwargs"])
    chain = events(seed, start)
    previous = chain[-1] if chain else None
    unit = start
    while True:
        work = build_unit(seed, unit, previous)
        store.commit(work)
        os.write(1, f"acked {unit}\n".encode())
        previous = work.appends[0]
        unit += 1


if __name__ == "__main__":
    main(sys.argv)
