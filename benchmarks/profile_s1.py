"""Where S1's time goes: one durable transition taken apart.

From the repository root::

    python benchmarks/profile_s1.py [--workflows N] [--dir DIR]

Four measurements of the same workload (create + the lifecycle's five
transitions per workflow), each on a fresh store:

1. wall time per operation with ``synchronous=full`` (S1 itself);
2. the same with ``synchronous=normal``: the difference is the WAL sync;
3. the same on the memory adapter: everything above the port;
4. a ``cProfile`` run of (1), whose self time is grouped by what it does:
   canonical JSON encoding and parsing, sealing and hashing (AES-GCM, HMAC,
   SHA-256), model validation (pydantic), SQL (every call into ``sqlite3``,
   its sync included), and flowvault's own Python (domain, application,
   adapter code). Profiling inflates the share of Python code that makes
   many small calls, so read the groups as proportions, not microseconds.

It also reports how many WAL frames (pages) one transition's commit
writes, against one for the raw single-row baseline, and which tables and
indexes those pages belong to.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sqlite3
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Final

from _workload import Orders, run_lifecycles, sqlite_settings

from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.application import Guard
from flowvault.application._high_water_store import HighWaterStore
from flowvault.composition import Runtime, Settings, bootstrap

GROUPS: Final = (
    ("SQL (sqlite3 calls, sync included)", ("sqlite3.Connection", "sqlite3.Cursor")),
    ("sealing and hashing", ("AESGCM", "hmac", "_hashlib", "openssl", "hashlib", "crypto/")),
    ("canonical JSON", ("_canonical.py", "json/", "_json")),
    ("model validation (pydantic)", ("pydantic",)),
    ("adapter code", ("adapters/",)),
    ("domain code", ("domain/",)),
    ("application code", ("application/",)),
)
OTHER: Final = "other (interpreter, stdlib)"


def _per_op_us(settings: Settings, workflows: int) -> float:
    with bootstrap(settings, create=True) as runtime:
        run = run_lifecycles(runtime.workflows, Orders("profile").take(workflows))
        if run.errors:
            raise SystemExit(f"{run.errors} operations failed")
        operations = len(run.ordinary_ms) + len(run.terminal_ms)
        return run.seconds / operations * 1e6


def _group_of(key: tuple[str, int, str]) -> str:
    where = f"{key[0]}:{key[2]}"
    for name, markers in GROUPS:
        if any(marker in where for marker in markers):
            return name
    return OTHER


def _profile(settings: Settings, workflows: int) -> dict[str, float]:
    profiler = cProfile.Profile(time.perf_counter)
    with bootstrap(settings, create=True) as runtime:
        orders = Orders("profiled").take(workflows)
        profiler.enable()
        run_lifecycles(runtime.workflows, orders)
        profiler.disable()
    stats = pstats.Stats(profiler)
    shares: dict[str, float] = defaultdict(float)
    for key, (_, _, self_time, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        shares[_group_of(key)] += self_time
    total = sum(shares.values())
    return {name: seconds / total for name, seconds in shares.items()}


def _created(
    runtime: Runtime, tag: str, workflows: int
) -> tuple[list[str], SQLiteSecureObjectStore]:
    """Create ``workflows`` workflows; return their ids and the SQLite store, its checkpoints off.

    The store's background checkpoint would restart the WAL in the middle
    of a measurement, so it is stopped; ``compact`` still checkpoints.
    """
    ids = [runtime.workflows.create(order)[0].workflow_id for order in Orders(tag).take(workflows)]
    store = runtime.store
    inner = store.wrapped if isinstance(store, HighWaterStore) else store
    if not isinstance(inner, SQLiteSecureObjectStore):
        raise SystemExit("expected the SQLite store")
    if inner._checkpointer is not None:
        inner._checkpointer.stop()
    return ids, inner


def _entered(call: Callable[[], object]) -> tuple[int, int]:
    """Return how many of flowvault's modules and functions one ``call`` enters."""
    profiler = cProfile.Profile()
    profiler.runcall(call)
    stats = pstats.Stats(profiler)
    ours = [key for key in stats.stats if "/flowvault/" in key[0]]  # type: ignore[attr-defined]
    return len({key[0] for key in ours}), len(ours)


def _path_lengths(home: Path) -> dict[str, tuple[int, int]]:
    """Measure the path of one write: a transition, from its own last commit and from a read.

    The first transition warms every lazy import and cache; the two measured
    ones are the steady state. ``repository.write`` is the plain sealed
    write a host makes without the workflow service.
    """
    with bootstrap(sqlite_settings(home, synchronous="normal"), create=True) as runtime:
        workflows = runtime.workflows
        record, _ = workflows.create(Orders("path").take(1)[0])
        moved = workflows.transition(
            record.workflow_id, "planning", expected_state="intake", expected_version=1
        )
        cached = _entered(
            lambda: workflows.transition(
                moved.workflow_id, "executing", expected_state="planning", expected_version=2
            )
        )
        other = bootstrap(sqlite_settings(home, synchronous="normal"), create=True)
        try:
            read = _entered(
                lambda: other.workflows.transition(
                    moved.workflow_id, "decision", expected_state="executing", expected_version=3
                )
            )
        finally:
            other.close()
        repository = runtime.repository
        repository.write("path.docs", "warm", {"n": 0}, expected=Guard.ABSENT)
        write = _entered(
            lambda: repository.write("path.docs", "one", {"n": 1}, expected=Guard.ABSENT)
        )
    return {
        "one `workflows.transition`, from its own last commit": cached,
        "one `workflows.transition`, its base read from the store": read,
        "one `repository.write`": write,
    }


def _to_planning(runtime: Runtime, workflow_id: str) -> None:
    workflows = runtime.workflows
    workflows.transition(workflow_id, "planning", expected_state="intake", expected_version=1)


def _frames_per_transition(home: Path, workflows: int) -> float:
    """Count WAL frames written by transitions alone, with checkpoints held off."""
    settings = sqlite_settings(home, synchronous="normal")
    with bootstrap(settings, create=True) as runtime:
        created, store = _created(runtime, "frames", workflows)
        wal = store.path.with_name(store.path.name + "-wal")
        store.compact()
        before = wal.stat().st_size
        for workflow_id in created:
            _to_planning(runtime, workflow_id)
        page_size = 4096 + 24
        return (wal.stat().st_size - before) / page_size / len(created)


def _pages(database: Path, page_size: int) -> dict[int, bytes]:
    data = database.read_bytes()
    return {n + 1: data[n * page_size : (n + 1) * page_size] for n in range(len(data) // page_size)}


def _pages_by_table(home: Path, workflows: int, sample: int = 20) -> dict[str, float] | None:
    """Return the pages one transition changes, per table or index (``None`` without dbstat).

    Each sampled transition runs between two full checkpoints, and the
    database file's pages are compared before and after; SQLite's
    ``dbstat`` names the b-tree each changed page belongs to. The WAL frame
    count above counts the same pages as the log writes them.
    """
    settings = sqlite_settings(home, synchronous="normal")
    with bootstrap(settings, create=True) as runtime:
        created, store = _created(runtime, "pages", workflows)
        with closing(sqlite3.connect(store.path)) as probe:
            try:
                probe.execute("SELECT 1 FROM dbstat LIMIT 1").fetchall()
            except sqlite3.OperationalError:
                return None
            page_size = int(probe.execute("PRAGMA page_size").fetchone()[0])
            changed: Counter[str] = Counter()
            for workflow_id in created[:sample]:
                store.compact()
                before = _pages(store.path, page_size)
                _to_planning(runtime, workflow_id)
                store.compact()
                owners = dict(probe.execute("SELECT pageno, name FROM dbstat").fetchall())
                for number, page in _pages(store.path, page_size).items():
                    if before.get(number) != page:
                        changed[str(owners.get(number, "free pages"))] += 1
    count = min(sample, len(created))
    return {name: pages / count for name, pages in changed.most_common()}


def _line(label: str, value: str) -> str:
    return f"| {label} | {value} |"


def main(argv: list[str]) -> int:
    """Print the breakdown as a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=100)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="fvprofile-", dir=args.dir))
    fresh: Callable[[str], Path] = lambda name: root / name  # noqa: E731
    full = _per_op_us(sqlite_settings(fresh("full")), args.workflows)
    normal = _per_op_us(sqlite_settings(fresh("normal"), synchronous="normal"), args.workflows)
    memory = _per_op_us(
        Settings.model_validate({"backend": "memory", "home": fresh("memory")}), args.workflows
    )
    shares = _profile(sqlite_settings(fresh("profiled")), args.workflows)
    frames = _frames_per_transition(fresh("frames"), args.workflows)
    by_table = _pages_by_table(fresh("pages"), args.workflows)
    paths = _path_lengths(fresh("path"))
    print("| measure | value |")
    print("|---|---|")
    print(_line("S1 per operation, synchronous=full", f"{full:.0f} us"))
    print(_line("the same, synchronous=normal", f"{normal:.0f} us"))
    print(_line("WAL sync (difference)", f"{full - normal:.0f} us"))
    print(_line("memory adapter (all work above the port)", f"{memory:.0f} us"))
    print(_line("SQLite adapter and file work (normal - memory)", f"{normal - memory:.0f} us"))
    print(_line("WAL frames written per transition commit", f"{frames:.1f} (raw baseline: 1)"))
    if by_table is None:
        print(_line("pages changed per transition, by table", "no dbstat in this SQLite"))
    else:
        for name, pages in by_table.items():
            print(_line(f"pages changed per transition: {name}", f"{pages:.2f}"))
    for name, (modules, functions) in paths.items():
        print(_line(f"{name}: flowvault modules, functions entered", f"{modules}, {functions}"))
    for name, share in sorted(shares.items(), key=lambda item: -item[1]):
        print(_line(f"profiled self time: {name}", f"{share:.0%}"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
