"""One host of the run-lease harness (tests/reliability/test_run_leases_processes.py).

Usage: ``lease_worker.py sqlite|postgres TARGET HOST_ID ROLE DIR``, TARGET
being a SQLite home or a PostgreSQL schema (the DSN comes from
``TEST_POSTGRES_DSN``). The worker opens the store as host HOST_ID with a
3-second run lease, prints ``ready``, waits for ``DIR/go``, then plays ROLE,
appending one JSON line to ``DIR/HOST_ID.log`` after each write the store
acknowledged (the file is opened for appending, so a line is whole or
absent when the process is killed):

    living: holds one running run and one accepted run, appending an event
        to each every few hundredths of a second (which renews their leases)
        and calling ``recover_incomplete_runs`` about twice a second, until
        ``DIR/stop`` exists; then runs and finishes both. Logs ``recovered``
        counts.
    victim: finishes one run, then holds two running runs and one accepted
        run, appending to them forever, until the parent kills it.
    zombie: the victim's host id come back with a stale view: tries to
        finish, append to and renew each run named in ``DIR/taken``; prints
        one JSON line of the error codes it got, writing nothing to the log.

A ``RUN_FENCED`` or any other error in ``living`` or ``victim`` ends the
worker with a traceback and a non-zero exit.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from flowvault.application import RunService
from flowvault.composition import Settings, bootstrap
from flowvault.domain import FlowvaultError

KEY = bytes(range(32))
DEFINITION = "lease.demo"
LEASE_SECONDS = 3.0
ROUND_PAUSE = 0.05
RECOVER_EVERY = 0.5
"""Seconds between two recoveries by a living host."""


def settings(backend: str, target: str, host_id: str) -> Settings:
    """Return settings for a SQLite home or a PostgreSQL schema, as host ``host_id``."""
    lease = {"host_id": host_id, "run_lease": LEASE_SECONDS}
    if backend == "sqlite":
        return Settings(backend="sqlite", home=Path(target), **lease)  # type: ignore[arg-type]
    return Settings(
        backend="postgres",
        postgres_dsn=os.environ["TEST_POSTGRES_DSN"],
        postgres_schema=target,
        postgres_pool_size=2,
        **lease,  # type: ignore[arg-type]
    )


class Log:
    """Acknowledged writes, one JSON line each, appended whole."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def write(self, **entry: object) -> None:
        """Append one entry, stamped with this process's monotonic clock (for diagnosis only)."""
        entry["t"] = round(time.monotonic(), 3)
        os.write(self._fd, (json.dumps(entry) + "\n").encode())


def hold(runs: RunService, log: Log, count: int) -> tuple[list[str], str]:
    """Start ``count`` running runs and one accepted run; return them, logging each write."""
    running = []
    for _ in range(count):
        run_id = runs.start_run(DEFINITION, {"n": 1})[0].run_id
        log.write(op="start", run=run_id)
        runs.set_status(run_id, "running", expected_status="accepted")
        log.write(op="running", run=run_id)
        running.append(run_id)
    accepted = runs.start_run(DEFINITION, {"n": 2})[0].run_id
    log.write(op="start", run=accepted)
    return running, accepted


def append_round(runs: RunService, log: Log, run_ids: list[str], n: int) -> None:
    """Append event ``n`` to each run, logging each acknowledged append."""
    for run_id in run_ids:
        runs.append_run_events(run_id, [("work.step", {"n": n})])
        log.write(op="event", run=run_id, n=n)


def living(runs: RunService, log: Log, folder: Path) -> None:
    """Keep two runs leased and recover others' between rounds; finish them when told."""
    running, accepted = hold(runs, log, 1)
    n, recovered_at = 0, time.monotonic()
    while not (folder / "stop").exists():
        n += 1
        append_round(runs, log, [*running, accepted], n)
        if time.monotonic() - recovered_at >= RECOVER_EVERY:
            recovered = runs.recover_incomplete_runs()
            recovered_at = time.monotonic()
            if recovered:
                log.write(op="recovered", count=recovered)
        time.sleep(ROUND_PAUSE)
    runs.set_status(accepted, "running", expected_status="accepted")
    log.write(op="running", run=accepted)
    for run_id in [*running, accepted]:
        runs.finish_run(run_id, "completed", expected_status="running", final_state={"n": n})
        log.write(op="finish", run=run_id)


def victim(runs: RunService, log: Log) -> None:
    """Finish one run, then keep three runs open until killed."""
    done = runs.start_run(DEFINITION, {"n": 0})[0].run_id
    log.write(op="start", run=done)
    runs.set_status(done, "running", expected_status="accepted")
    log.write(op="running", run=done)
    runs.finish_run(done, "completed", expected_status="running", final_state=None)
    log.write(op="finish", run=done)
    running, accepted = hold(runs, log, 2)
    n = 0
    while True:
        n += 1
        append_round(runs, log, [*running, accepted], n)
        time.sleep(ROUND_PAUSE)


def zombie(runs: RunService, folder: Path) -> None:
    """Try each write on each run taken from this host; print the codes, keyed by run."""
    codes: dict[str, list[str]] = {}
    for run_id in json.loads((folder / "taken").read_text()):
        codes[run_id] = [_outcome(write, runs, run_id) for write in ZOMBIE_WRITES]
    print(json.dumps(codes), flush=True)


def _finish(runs: RunService, run_id: str) -> object:
    return runs.finish_run(run_id, "completed", expected_status="running", final_state=1)


def _append(runs: RunService, run_id: str) -> object:
    return runs.append_run_events(run_id, [("work.step", {"n": -1})])


def _renew(runs: RunService, run_id: str) -> object:
    return runs.renew_lease(run_id)


ZOMBIE_WRITES = (_finish, _append, _renew)


def _outcome(write: Callable[[RunService, str], object], runs: RunService, run_id: str) -> str:
    try:
        write(runs, run_id)
    except FlowvaultError as refused:
        return refused.code
    return "ACCEPTED"


def main(backend: str, target: str, host_id: str, role: str, folder: str) -> None:
    """Open the store as ``host_id`` and play ``role`` once the parent says go."""
    where = Path(folder)
    with bootstrap(settings(backend, target, host_id), key=KEY) as runtime:
        print("ready", flush=True)
        while not (where / "go").exists():
            time.sleep(0.01)
        log = Log(where / f"{host_id}.log")
        if role == "living":
            living(runtime.runs, log, where)
        elif role == "victim":
            victim(runtime.runs, log)
        else:
            zombie(runtime.runs, where)


if __name__ == "__main__":
    main(*sys.argv[1:])
