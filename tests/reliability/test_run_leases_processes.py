"""Several hosts on one store: a killed host's runs are taken over, and nobody else's.

Four real processes, each a host with its own id and a 3-second run lease,
drive runs concurrently on one PostgreSQL schema, or one SQLite file. One
(the victim) is SIGKILLed mid-run. The three living hosts keep renewing
their own leases and run recovery between rounds; once the victim's leases
expire, their recovery takes over exactly the victim's unfinished runs,
each once. Then a process with the victim's host id and a stale view tries
to write to those runs and is refused (``RUN_FENCED``). Every write a host
logged as acknowledged is in the store, and nothing a living host wrote is
touched.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flowvault.composition import Runtime, Settings, bootstrap

WORKER = Path(__file__).with_name("lease_worker.py")
KEY = bytes(range(32))
LIVING = ("host-1", "host-2", "host-3")
VICTIM = "host-4"
WAIT = 30.0
"""Seconds the parent waits for something the workers must do; reached only on a failure."""


def _settings(backend: str, target: str, dsn: str | None) -> Settings:
    if backend == "sqlite":
        return Settings(backend="sqlite", home=Path(target), host_id="observer")
    return Settings(
        backend="postgres",
        postgres_dsn=dsn,
        postgres_schema=target,
        host_id="observer",
    )  # type: ignore[arg-type]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str, str | None]]:
    """Provide a backend, its SQLite home or PostgreSQL schema, and the DSN if any."""
    if request.param == "sqlite":
        yield "sqlite", str(tmp_path / "home"), None
        return
    server = request.getfixturevalue("postgres_server")
    yield "postgres", request.getfixturevalue("pg_schema"), server.dsn


def _spawn(target: tuple[str, str, str | None], host: str, role: str, folder: Path) -> Any:
    backend, where, dsn = target
    env = {**os.environ, "TEST_POSTGRES_DSN": dsn or ""}
    return subprocess.Popen(
        [sys.executable, str(WORKER), backend, where, host, role, str(folder)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _log(folder: Path, host: str) -> list[dict[str, Any]]:
    path = folder / f"{host}.log"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def _wait_until(done: Any, why: str) -> None:
    deadline = time.monotonic() + WAIT
    while not done():
        assert time.monotonic() < deadline, why
        time.sleep(0.05)


def _unfinished(entries: list[dict[str, Any]]) -> set[str]:
    started = {entry["run"] for entry in entries if entry["op"] == "start"}
    return started - {entry["run"] for entry in entries if entry["op"] == "finish"}


def _open_runs(runtime: Runtime) -> set[str]:
    found = set()
    for status in ("accepted", "running"):
        page = runtime.runs.list_runs(status, limit=200)
        found |= {run.run_id for run in page.items}
    return found


def _events(runtime: Runtime, run_id: str) -> list[Any]:
    page = runtime.runs.read_run_events(run_id)
    events = list(page.events)
    while page.next_cursor is not None:
        page = runtime.runs.read_run_events(run_id, page.next_cursor)
        events += page.events
    return events


def test_a_killed_hosts_runs_are_taken_over_and_it_is_fenced(
    target: tuple[str, str, str | None], tmp_path: Path
) -> None:
    """Recovery takes exactly the dead host's unfinished runs; its late writes are refused."""
    folder = tmp_path / "harness"
    folder.mkdir()
    settings = _settings(*target)
    with bootstrap(settings, key=KEY, create=True) as runtime:
        runtime.definitions.register_definition("lease.demo", {"nodes": ["step"]})
    workers = {host: _spawn(target, host, "living", folder) for host in LIVING}
    workers[VICTIM] = _spawn(target, VICTIM, "victim", folder)
    try:
        for worker in workers.values():
            assert worker.stdout.readline().strip() == "ready", worker.communicate()[1]
        (folder / "go").touch()
        _wait_until(
            lambda: sum(entry["op"] == "event" for entry in _log(folder, VICTIM)) >= 30,
            "the victim made no progress",
        )
        workers[VICTIM].send_signal(signal.SIGKILL)
        workers[VICTIM].wait()
        victim_log = _log(folder, VICTIM)
        with bootstrap(settings, key=KEY) as observer:
            _wait_until(
                lambda: not (_open_runs(observer) & _unfinished(victim_log)),
                "the living hosts never took over the victim's runs",
            )
        (folder / "stop").touch()
        for host in LIVING:
            _, err = workers[host].communicate(timeout=WAIT)
            assert workers[host].returncode == 0, err[-3000:]
    finally:
        for worker in workers.values():
            if worker.poll() is None:
                worker.kill()
                worker.wait()

    taken = sorted(_unfinished(victim_log))
    assert len(taken) == 3
    (folder / "taken").write_text(json.dumps(taken))
    with bootstrap(settings, key=KEY) as observer:
        before = {
            run_id: (observer.runs.get_run(run_id), _events(observer, run_id)) for run_id in taken
        }
    zombie = _spawn(target, VICTIM, "zombie", folder)
    out, err = zombie.communicate(timeout=WAIT)
    assert zombie.returncode == 0, err[-3000:]
    assert json.loads(out.splitlines()[-1]) == {run_id: ["RUN_FENCED"] * 3 for run_id in taken}

    with bootstrap(settings, key=KEY) as observer:
        _check_store(observer, folder, taken, before)


def _check_store(observer: Runtime, folder: Path, taken: list[str], before: dict[str, Any]) -> None:
    """Every acknowledged write is stored; only the victim's unfinished runs were taken over."""
    logs = {host: _log(folder, host) for host in (*LIVING, VICTIM)}
    victim_digest = observer.runs.owner_digest(VICTIM)
    interrupted = set()
    for host, entries in logs.items():
        finished = {entry["run"] for entry in entries if entry["op"] == "finish"}
        acknowledged = Counter(entry["run"] for entry in entries if entry["op"] == "event")
        for run_id in {entry["run"] for entry in entries if entry["op"] == "start"}:
            run = observer.runs.get_run(run_id)
            events = _events(observer, run_id)
            steps = [event.payload["n"] for event in events if event.type == "work.step"]
            assert steps == list(range(1, len(steps) + 1))
            assert len(steps) >= acknowledged[run_id]
            if run_id in finished:
                assert (run.status, run.owner) == ("completed", None)
                continue
            assert host == VICTIM, f"a living host's run was left {run.status}"
            assert run.status == "interrupted_non_resumable"
            assert run.owner in LIVING
            assert events[-1].payload["detail"]["previous_owner"] == victim_digest
            assert (run, events) == before[run_id], "the fenced host's writes changed the run"
            interrupted.add(run_id)
    assert interrupted == set(taken)
    recovered = sum(
        entry["count"] for host in LIVING for entry in logs[host] if entry["op"] == "recovered"
    )
    assert recovered == len(taken)
    for host in LIVING:
        assert len([entry for entry in logs[host] if entry["op"] == "finish"]) == 2
    assert observer.audit().run().ok
