"""The benchmark suite runs end to end at ``--quick`` size and reports sane figures.

It asserts no speed: the figures depend on the machine and whatever else
runs on it. The PostgreSQL scenarios use the server at ``TEST_POSTGRES_DSN``
in a throwaway schema; without a server the test checks everything else,
then skips with a one-line reason (and fails under ``CI=true``), as the
tests marked ``postgres`` do. S1, S2 and S5a carry the peer's figures when
its packages (the ``bench`` extra) import here, else the reason they do not;
under ``CI=true`` the peer must be there.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ROOT / "benchmarks" / "run.py"
DSN_ENV = "TEST_POSTGRES_DSN"
RUN_TIMEOUT = 900
TABLE_HEADER = (
    "| scenario | ops/s median [min\u2013max] | p50 ms | p99 ms | ratio | peer ratio "
    "| baseline ops/s | peer ops/s median [min\u2013max] | peer p50 / p99 ms | notes |"
)
PEER_ROWS = {"S1", "S2", "S5a", "S8-pairs", "S8-latest"}
PEER_MODULES = ("langgraph.checkpoint.sqlite", "langgraph.checkpoint.serde.encrypted", "Crypto")

ROWS = {
    "S1": ["S1"],
    "S1-memory": ["S1-memory"],
    "S2": ["S2"],
    "S3": ["S3-100-ordinary", "S3-100-terminal", "S3-1000-ordinary", "S3-1000-terminal"],
    "S4": ["S4-stream", "S4-cli"],
    "S5a": ["S5a"],
    "S5b": ["S5b"],
    "S6": ["S6-S1", "S6-S2", "S6-S5a"],
    "S7": [f"S7-{backend}-{hosts}" for backend in ("sqlite", "postgres") for hosts in (1, 2, 4)],
    "S8": ["S8-pairs", "S8-latest"],
}


def _run_quick(tmp_path: Path, dsn: str, schema: str) -> tuple[str, dict[str, Any]]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("FLOWVAULT_")}
    out = tmp_path / "bench.json"
    command = [sys.executable, str(RUNNER), "--quick", "--out", str(out), "--dir", str(tmp_path)]
    completed = subprocess.run(
        [*command, "--postgres-schema", schema],
        cwd=ROOT,
        env={**env, DSN_ENV: dsn},
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    return completed.stdout, json.loads(out.read_text(encoding="utf-8"))


def _check_figures(figures: dict[str, Any], where: str) -> None:
    rates = figures["ops_per_s"]
    assert figures["repetitions"] >= 5, where
    assert len(rates["repetitions"]) == figures["repetitions"], where
    assert 0 < rates["min"] <= rates["median"] <= rates["max"], where
    assert all(rate > 0 for rate in rates["repetitions"]), where
    assert 0 < figures["p50_ms"] <= figures["p99_ms"], where
    assert figures["operations"] > 0, where
    assert figures["errors"] == 0, where


def _peer_installed() -> bool:
    """Whether the runner, started with this interpreter, can import the peer."""
    try:
        return all(importlib.util.find_spec(name) is not None for name in PEER_MODULES)
    except ModuleNotFoundError:
        return False


def _check_peer(row: dict[str, Any], installed: bool) -> None:
    peer, where = row["peer"], f"{row['id']} peer"
    if row["id"] not in PEER_ROWS:
        assert peer is None, where
        assert row["peer_ratio"] is None, where
        return
    assert peer["name"] == "LangGraph SqliteSaver, AES-GCM", where
    if not installed:
        assert peer["status"] == "not installed", where
        assert "install the bench extra" in peer["reason"], where
        assert row["peer_ratio"] is None, where
        return
    assert peer["status"] == "ok", (where, peer["reason"])
    _check_figures(peer, where)
    expected = row["ops_per_s"]["median"] / peer["ops_per_s"]["median"]
    assert row["peer_ratio"] == pytest.approx(expected), where
    assert row["peer_ratio"] > 0, where


def _check_scenario(scenario: dict[str, Any], scenario_id: str, installed: bool) -> None:
    assert scenario["status"] == "ok", (scenario_id, scenario["reason"])
    expected = ROWS[scenario_id]
    if scenario_id == "S7" and scenario["extra"]["postgres"] != "ran":
        expected = [row for row in expected if "postgres" not in row]
    assert [row["id"] for row in scenario["rows"]] == expected
    for row in scenario["rows"]:
        _check_figures(row, row["id"])
        _check_figures(row["baseline"], f"{row['id']} baseline")
        assert row["baseline"]["name"], row["id"]
        assert row["ratio"] > 0, row["id"]
        _check_peer(row, installed)


def _check_extras(scenarios: dict[str, Any], installed: bool) -> None:
    types = scenarios["S2"]["extra"]["peer_checkpoint_types"]
    if installed:
        assert types, "the peer stored no checkpoints"
        assert all(kind.endswith("+aes") for kind in types), types
    else:
        assert types == []
    growth = scenarios["S3"]["extra"]
    assert growth["peak_rss_mb"] > 0
    assert growth["growth"]["ordinary_cost_ratio"] > 0
    assert growth["growth"]["terminal_cost_ratio"] > 0
    assert [size["size"] for size in growth["sizes"]] == [100, 1000]
    ledger = scenarios["S4"]["extra"]
    assert ledger["cli_workflows"] == 500
    assert ledger["cli_streams_checked"] == 2 * 500, "each workflow's stream and its marker's"
    assert ledger["cli_records"]["unreadable"] == 0
    assert scenarios["S5a"]["extra"]["errors"] == 0
    assert scenarios["S5b"]["extra"]["errors"] == 0
    assert scenarios["S7"]["extra"]["errors"] == 0


def _check_table(stdout: str, scenarios: dict[str, Any]) -> None:
    assert TABLE_HEADER in stdout
    lines = stdout.splitlines()
    for scenario in scenarios.values():
        ids = [row["id"] for row in scenario["rows"]] or [scenario["id"]]
        for row_id in ids:
            assert any(line.startswith(f"| {row_id} ") for line in lines), row_id
        for row in scenario["rows"]:
            if row["id"] not in PEER_ROWS:
                continue
            line = next(line for line in lines if line.startswith(f"| {row['id']} "))
            ratio = row["peer_ratio"]
            expected = "not installed: " if ratio is None else f"| {ratio:.3f} |"
            assert expected in line, (row["id"], line)


def test_quick_benchmarks_report_every_scenario(tmp_path: Path, postgres_server) -> None:
    """Every scenario is present with sane figures, and the table is printed."""
    schema = postgres_server.new_schema()
    report: dict[str, Any] | None = None
    try:
        stdout, report = _run_quick(tmp_path, postgres_server.dsn, schema)
    finally:
        if report is None or report["scenarios"]["S6"]["status"] != "skipped":
            with contextlib.suppress(Exception):
                postgres_server.drop_schema(schema)
    scenarios = report["scenarios"]
    installed = _peer_installed()
    if not installed and os.environ.get("CI") == "true":
        pytest.fail(
            "the peer (the bench extra) is not installed: CI measures it for real", pytrace=False
        )
    assert list(scenarios) == list(ROWS)
    assert report["ok"] is True
    assert report["parameters"]["peer"]["installed"] is installed
    assert report["metadata"]["quick"] is True
    for key in ("date", "python", "sqlite_version", "platform", "cpu_count"):
        assert report["metadata"][key], key
    assert report["parameters"]["repetitions"] >= 5
    for scenario_id in ROWS:
        if scenario_id != "S6":
            _check_scenario(scenarios[scenario_id], scenario_id, installed)
    _check_extras(scenarios, installed)
    _check_table(stdout, scenarios)
    postgres = scenarios["S6"]
    if postgres["status"] == "skipped":
        message = f"S6 (PostgreSQL at ${DSN_ENV}) skipped: {postgres['reason']}"
        if os.environ.get("CI") == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    _check_scenario(postgres, "S6", installed)
    assert scenarios["S7"]["extra"]["postgres"] == "ran", scenarios["S7"]["extra"]


def test_the_s1_profile_takes_one_transition_apart(tmp_path: Path) -> None:
    """``profile_s1.py`` runs on a guarded store and names where a transition's pages go."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("FLOWVAULT_")}
    script = ROOT / "benchmarks" / "profile_s1.py"
    completed = subprocess.run(
        [sys.executable, str(script), "--workflows", "8", "--dir", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    rows = dict(
        line.strip("|").split("|")[:2] for line in completed.stdout.splitlines()[2:] if "|" in line
    )
    measures = {name.strip(): value.strip() for name, value in rows.items()}
    frames = float(measures["WAL frames written per transition commit"].split()[0])
    assert frames >= 1
    pages = {
        name.removeprefix("pages changed per transition: "): float(value)
        for name, value in measures.items()
        if name.startswith("pages changed per transition: ")
    }
    if pages:
        assert {"records", "ledger_events"} <= set(pages)
    else:
        assert measures["pages changed per transition, by table"] == "no dbstat in this SQLite"


def _report(date: str, rates: dict[str, tuple[float, float | None]]) -> dict[str, Any]:
    rows = [
        {
            "id": row_id,
            "label": "label",
            "ops_per_s": {"median": rate},
            "p99_ms": 2.0,
            "ratio": rate / 1000,
            "peer_ratio": peer,
        }
        for row_id, (rate, peer) in rates.items()
    ]
    return {
        "metadata": {"date": date},
        "scenarios": {
            "S1": {"status": "ok", "rows": rows},
            "S6": {"status": "skipped", "rows": []},
        },
    }


def test_the_summary_reads_several_runs_as_medians_and_ranges(tmp_path: Path) -> None:
    """``summary.py`` gives each row the median of its runs' medians and their range."""
    reports = [
        _report("d1", {"S1": (900.0, 0.3), "S1-memory": (5000.0, None)}),
        _report("d2", {"S1": (1100.0, 0.4), "S1-memory": (5200.0, None)}),
        _report("d3", {"S1": (1000.0, 0.2)}),
    ]
    names = []
    for number, report in enumerate(reports):
        path = tmp_path / f"run{number}.json"
        path.write_text(json.dumps(report), encoding="utf-8")
        names.append(str(path))
    script = ROOT / "benchmarks" / "summary.py"
    completed = subprocess.run(
        [sys.executable, str(script), *names],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert lines[0] == "3 runs: d1, d2, d3"
    assert lines[3] == (
        "| S1 label (3 runs) | 1,000 [900\u20131,100] | 2.00 [2.00\u20132.00] "
        "| 1.000 [0.900\u20131.100] | 0.300 [0.200\u20130.400] |"
    )
    assert lines[4] == (
        "| S1-memory label (2 runs) | 5,100 [5,000\u20135,200] | 2.00 [2.00\u20132.00] "
        "| 5.100 [5.000\u20135.200] | - |"
    )
    usage = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert usage.returncode == 2
    assert "usage" in usage.stderr


ASYNC_MECHANISMS = {
    "sqlite": ["inline", "to_thread", "pool-2", "pool-4", "pool-8", "pool-16", "writer"],
    "postgres": ["inline", "to_thread", "pool-4", "pool-16", "writer"],
}
ASYNC_WORKLOADS = ["own scope (state save)", "one stream (append)", "one record (CAS increment)"]


@pytest.mark.postgres
def test_the_async_mechanisms_comparison_reports_every_row(postgres_server) -> None:
    """``async_mechanisms.py --quick`` prints a row per backend, workload and mechanism."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("FLOWVAULT_")}
    completed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "async_mechanisms.py"), "--quick"],
        cwd=ROOT,
        env={**env, DSN_ENV: postgres_server.dsn},
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in completed.stdout.splitlines()
        if line.startswith("| sqlite") or line.startswith("| postgres")
    ]
    expected = [
        (backend, workload, mechanism)
        for backend, mechanisms in ASYNC_MECHANISMS.items()
        for workload in ASYNC_WORKLOADS
        for mechanism in mechanisms
    ]
    expected += [
        ("postgres (psycopg only)", "INSERT + COMMIT", "pool-4 + sync pool"),
        ("postgres (psycopg only)", "INSERT + COMMIT", "AsyncConnectionPool"),
    ]
    assert [tuple(row[:3]) for row in rows] == expected
    for row in rows:
        rate, ratio, p50, p99, _lag, errors, per_sync = row[3:]
        assert float(rate) > 0, row
        assert 0 <= float(p50) <= float(p99), row
        assert errors == "0", row
        if row[2] in {"to_thread", "pool-4 + sync pool"}:
            assert ratio == "1.00", row
        if row[0] == "sqlite":
            assert float(per_sync) >= 1, row
