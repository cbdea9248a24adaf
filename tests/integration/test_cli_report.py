"""``flowvault report --html OUT`` as a real subprocess, its page rendered by headless Chromium.

The store is written in-process on a real SQLite home, with a canary in
every place a caller's plaintext can go (work order, state, run input,
event payloads, audience, decisions, actor); the page must hold none of
them. Chromium renders each page: the verdict and the timeline are what a
reader sees, not only what the file says. Without Chromium the browser
tests skip, except under ``CI=true``, where ``.ci/run`` installs it.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from checkpoint_setup import create_checkpoint, request_approval
from cli_helpers import json_document, run_cli

from flowvault.application import HistoryEvent
from flowvault.composition import Settings, bootstrap
from flowvault.domain import WorkflowState, WorkOrder

CANARIES = {
    "order": "canary-order-param-71c3",
    "requester": "canary-requester-9a2e@example.org",
    "state": "canary-state-4b8d",
    "input": "canary-run-input-e51f",
    "event": "canary-event-payload-0d6a",
    "audience": "canary-audience-3f90",
    "approve": "canary-approve-8c41",
    "reject": "canary-reject-27be",
    "actor": "canary-actor-b7d2@example.org",
    "final": "canary-final-state-6e13",
    "scope": "canary-scope-value-1a5c",
}
SCOPE = "ledger-main"
EXTERNAL = re.compile(r"https?://|src\s*=|<link|@import|@font-face|url\(|<script", re.IGNORECASE)
TIMELINE_ROW = re.compile(r'<tr class="event[ "]')
BROWSER_TIMEOUT = 60.0


def _populate(home: Path) -> tuple[str, str]:
    """Write a workflow, a scope's state, and a run paused for approval, decided, finished.

    Returns the workflow id and the run id.
    """
    with bootstrap(Settings(backend="sqlite", home=home), create=True) as runtime:
        runtime.state(SCOPE).update_with_events(
            lambda _: (
                WorkflowState(step=1, data={"note": CANARIES["scope"]}),
                [HistoryEvent("state.stepped")],
            )
        )
        order = WorkOrder(
            kind="demo",
            parameters={"note": CANARIES["order"]},
            requester=CANARIES["requester"],
            idempotency_key="report-wf-1",
        )
        workflow, _ = runtime.workflows.create(order)
        runtime.workflow_events.append_event(
            workflow.workflow_id,
            "workflow.noted",
            expected_state=workflow.state,
            expected_version=workflow.state_version,
            payload={"note": CANARIES["event"]},
        )
        runs = runtime.runs
        runtime.definitions.register_definition("wire.send", {"nodes": ["send"]})
        run, _ = runs.start_run("wire.send", {"note": CANARIES["input"]})
        runs.set_status(run.run_id, "running", expected_status="accepted")
        state = {"note": CANARIES["state"]}
        checkpoint = create_checkpoint(runtime.checkpoints, run.run_id, {"n": 1}, state)
        runs.set_status(run.run_id, "awaiting_approval", expected_status="running")
        approval = request_approval(
            runtime.approvals,
            checkpoint,
            CANARIES["audience"],
            runtime.clock.now() + timedelta(hours=1),
            (CANARIES["approve"], CANARIES["reject"]),
        )
        runtime.approvals.decide(approval.approval_id, CANARIES["approve"], CANARIES["actor"])
        runs.set_status(run.run_id, "running", expected_status="awaiting_approval")
        runs.finish_run(
            run.run_id,
            "completed",
            expected_status="running",
            final_state={"note": CANARIES["final"]},
        )
        return workflow.workflow_id, run.run_id


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, str, str]:
    """Provide a SQLite home holding a workflow, a scope and a decided, finished run."""
    home = tmp_path / "home"
    workflow_id, run_id = _populate(home)
    return home, workflow_id, run_id


def _database(home: Path) -> Path:
    return Settings(backend="sqlite", home=home).database_path


def _rows(home: Path, where: str = "1 = 1", *params: str) -> int:
    with sqlite3.connect(_database(home)) as connection:
        query = f"SELECT COUNT(*) FROM ledger_events WHERE {where}"  # noqa: S608
        (count,) = connection.execute(query, params).fetchone()
    connection.close()
    return int(count)


def _distinct_streams(home: Path) -> int:
    with sqlite3.connect(_database(home)) as connection:
        (count,) = connection.execute("SELECT COUNT(DISTINCT stream) FROM ledger_events").fetchone()
    connection.close()
    return int(count)


def _chromium() -> str | None:
    """Return the Chromium to render with; skip without one, except under ``CI=true``."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is missing under CI=true: .ci/run installs it")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return found


def _rendered(page: Path, tmp_path: Path) -> str:
    """Return the DOM headless Chromium builds from ``page``, with no network."""
    browser = _chromium()
    assert browser is not None
    result = subprocess.run(
        [
            browser,
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            f"--user-data-dir={tmp_path / 'chromium-profile'}",
            "--dump-dom",
            page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=BROWSER_TIMEOUT,
        check=False,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    assert "</html>" in result.stdout, result.stderr
    return result.stdout


def _report(tmp_path: Path, home: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_cli(tmp_path, "report", "--html", str(out), *extra, home=home)


# -- the page itself -----------------------------------------------------------


def test_the_page_loads_nothing_and_holds_no_plaintext(
    tmp_path: Path, store: tuple[Path, str, str]
) -> None:
    """No address, source, link, import or script; no canary; every ledger event listed."""
    home, _, _ = store
    out = tmp_path / "report.html"
    result = _report(tmp_path, home, out, "--json")
    assert result.returncode == 0, result.stderr
    events = _rows(home)
    assert json_document(result) == {
        "schema_version": 1,
        "path": str(out),
        "verdict": "ok",
        "findings": 0,
        "events": events,
    }
    page = out.read_text(encoding="utf-8")
    assert EXTERNAL.search(page) is None, EXTERNAL.search(page)
    for name, canary in CANARIES.items():
        assert canary not in page, name
    assert len(TIMELINE_ROW.findall(page)) == events
    times = re.findall(r'<tr class="event"><td>([^<]*)</td>', page)
    assert times == sorted(times)
    assert "<dt>chain MACs</dt><dd>checked under the store key</dd>" in page
    assert '<dd id="covers">the whole store</dd>' in page
    assert re.search(r'<dd id="generated-at">\d{4}-\d\d-\d\dT[0-9:.]+Z</dd>', page)
    streams = _distinct_streams(home)
    assert f"<dt>streams verified</dt><dd>{streams}</dd>" in page
    assert f"<dt>events verified</dt><dd>{events}</dd>" in page
    decided = re.search(r'<tr class="event">(?:(?!</tr>).)*approval\.decided.*?</tr>', page)
    assert decided is not None
    digests = re.findall(r'<td class="digest">(sha256:[0-9a-f]{64})</td>', decided.group(0))
    assert len(digests) == 2
    receipts = re.findall(r'<tr class="receipt">.*?</tr>', page)
    assert len(receipts) == 1
    assert "<td>verified</td>" in receipts[0]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".report.html")] == []


def test_an_existing_page_is_replaced_whole(tmp_path: Path, store: tuple[Path, str, str]) -> None:
    """OUT is renamed over whole; a missing directory, store files and ``-`` are refused."""
    home, _, _ = store
    out = tmp_path / "report.html"
    out.write_text("old page " * 1000, encoding="utf-8")
    assert _report(tmp_path, home, out).returncode == 0
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert "old page" not in page
    missing = tmp_path / "no-such-dir" / "report.html"
    refused = _report(tmp_path, home, missing, "--json")
    assert refused.returncode == 1
    assert json_document(refused)["error"]["code"] == "INVALID_INPUT"  # type: ignore[index]
    assert not missing.parent.exists()
    key = home / "keys" / "store.key"
    before = key.read_bytes()
    for inside in (key, home / "data" / "report.html"):
        refused = _report(tmp_path, home, inside, "--json")
        assert refused.returncode == 1
        assert json_document(refused)["error"]["code"] == "INVALID_INPUT"  # type: ignore[index]
    assert key.read_bytes() == before
    assert not (home / "data" / "report.html").exists()
    assert run_cli(tmp_path, "report", "--html", "-", home=home).returncode == 2


def test_headless_chromium_renders_the_verdict_and_the_timeline(
    tmp_path: Path, store: tuple[Path, str, str]
) -> None:
    """The rendered DOM shows verdict ok, no finding, and one timeline row per ledger event."""
    home, _, _ = store
    out = tmp_path / "report.html"
    assert _report(tmp_path, home, out).returncode == 0
    dom = _rendered(out, tmp_path)
    assert re.search(r'id="verdict" class="verdict ok">verdict: ok<', dom)
    assert 'class="finding"' not in dom
    assert len(TIMELINE_ROW.findall(dom)) == _rows(home)
    for canary in CANARIES.values():
        assert canary not in dom


def test_a_tampered_store_reports_its_finding_highlighted(
    tmp_path: Path, store: tuple[Path, str, str]
) -> None:
    """An edited ledger row: exit 1, the page still written, the finding shown in the browser."""
    home, workflow_id, _ = store
    stream = f"workflow/{workflow_id}"
    with sqlite3.connect(_database(home)) as connection:
        changed = connection.execute(
            "UPDATE ledger_events SET payload = replace(payload, ?, ?) "
            "WHERE stream = ? AND idx = 1",
            (CANARIES["event"], "canary-event-payload-0d6b", stream),
        ).rowcount
    connection.close()
    assert changed == 1
    out = tmp_path / "report.html"
    result = _report(tmp_path, home, out)
    assert result.returncode == 1
    assert "INTEGRITY_FAILURE" in result.stderr
    assert "verdict: findings" in result.stdout
    document = json_document(_report(tmp_path, home, out, "--json"))
    assert document["verdict"] == "findings"
    assert document["findings"] == 1
    assert document["error"]["code"] == "INTEGRITY_FAILURE"  # type: ignore[index]
    dom = _rendered(out, tmp_path)
    assert 'class="verdict findings"' in dom
    findings = re.findall(r'<div class="finding">(.*?)</div>', dom)
    assert len(findings) == 1
    assert '<span class="code">edited</span>' in findings[0]
    assert f'<span class="stream">{stream}</span>' in findings[0]
    assert '<span class="sequence">1</span>' in findings[0]
    assert re.search(rf'<tr class="event broken"><td>[^<]*</td><td[^>]*>{stream}</td><td>1<', dom)
    assert "canary-event-payload-0d6" not in dom


# -- what a page covers ------------------------------------------------------------


@pytest.mark.parametrize("subject", ["--workflow", "--run", "--scope"])
def test_a_subject_covers_its_own_stream_only(
    tmp_path: Path, store: tuple[Path, str, str], subject: str
) -> None:
    """``--workflow``, ``--run`` and ``--scope`` list the events of their stream, no others."""
    home, workflow_id, run_id = store
    value, stream = {
        "--workflow": (workflow_id, f"workflow/{workflow_id}"),
        "--run": (run_id, f"run/{run_id}"),
        "--scope": (SCOPE, f"scope/{SCOPE}"),
    }[subject]
    out = tmp_path / "report.html"
    result = _report(tmp_path, home, out, subject, value, "--json")
    assert result.returncode == 0, result.stderr
    expected = _rows(home, "stream = ?", stream)
    assert expected > 0
    assert json_document(result)["events"] == expected
    page = out.read_text(encoding="utf-8")
    cells = re.findall(r'<tr class="event[^"]*"><td>[^<]*</td><td class="stream">([^<]*)<', page)
    assert cells == [stream] * expected
    assert f'<dd id="covers">{subject.removeprefix("--")} {value}</dd>' in page
    assert page.count('<tr class="receipt">') == (1 if subject == "--run" else 0)


def test_an_unknown_subject_writes_nothing(tmp_path: Path, store: tuple[Path, str, str]) -> None:
    """A run that does not exist is NOT_FOUND, and no page is written."""
    home, _, _ = store
    out = tmp_path / "report.html"
    result = _report(tmp_path, home, out, "--run", "no-such-run", "--json")
    assert result.returncode == 1
    assert json_document(result)["error"]["code"] == "NOT_FOUND"  # type: ignore[index]
    assert not out.exists()


def test_a_missing_store_writes_nothing(tmp_path: Path) -> None:
    """No store at the home: NOT_FOUND naming init, no page, no store created; --help documents."""
    home, out = tmp_path / "no-home", tmp_path / "report.html"
    result = _report(tmp_path, home, out)
    assert result.returncode == 1
    assert "NOT_FOUND" in result.stderr
    assert "flowvault init" in result.stderr
    assert not out.exists()
    assert not home.exists()
    helped = run_cli(tmp_path, "report", "--help")
    assert helped.returncode == 0
    for text in ("--html", "--workflow", "--run", "--scope", "--json", "exit codes"):
        assert text in helped.stdout


def test_subjects_exclude_each_other(tmp_path: Path, store: tuple[Path, str, str]) -> None:
    """At most one of --workflow, --run and --scope; --html is required."""
    home, workflow_id, run_id = store
    out = str(tmp_path / "report.html")
    both = run_cli(
        tmp_path, "report", "--html", out, "--workflow", workflow_id, "--run", run_id, home=home
    )
    assert both.returncode == 2
    assert run_cli(tmp_path, "report", home=home).returncode == 2


@pytest.mark.parametrize(
    ("statement", "code", "undecodable"),
    [
        (
            "UPDATE records SET payload = CAST(upper(hex(payload)) AS BLOB) "
            "WHERE namespace = 'flowvault.workflows'",
            "unreadable",
            False,
        ),
        (
            "UPDATE ledger_events SET payload = '{' WHERE stream LIKE 'workflow/%' AND idx = 1",
            "edited",
            True,
        ),
    ],
    ids=["sealed-record", "undecodable-row"],
)
def test_other_damage_is_a_finding_in_the_browser(
    tmp_path: Path, store: tuple[Path, str, str], statement: str, code: str, undecodable: bool
) -> None:
    """A sealed record that does not open, a ledger row that does not decode: shown as found."""
    home, workflow_id, _ = store
    with sqlite3.connect(_database(home)) as connection:
        assert connection.execute(statement).rowcount == 1
    connection.close()
    out = tmp_path / "report.html"
    result = _report(tmp_path, home, out, "--json")
    assert result.returncode == 1
    assert json_document(result)["verdict"] == "findings"
    dom = _rendered(out, tmp_path)
    findings = re.findall(r'<div class="finding">(.*?)</div>', dom)
    assert len(findings) == 1
    assert f'<span class="code">{code}</span>' in findings[0]
    stream = f"workflow/{workflow_id}"
    row = f'<tr class="event broken"><td>-</td><td class="stream">{stream}</td><td>1</td>'
    assert (row in dom) is undecodable
    assert len(TIMELINE_ROW.findall(dom)) == _rows(home)
