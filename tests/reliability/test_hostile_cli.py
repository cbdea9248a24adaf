"""Hostile argv for every ``flowvault`` verb: success, a coded error or a usage error, no crash.

The console script's ``main`` runs in process (with ``--debug``, so an
exception it did not mean to raise escapes instead of being folded into the
"unexpected ...; rerun with --debug" message) against a real SQLite home
holding a workflow, an action result, a state, a graph run with a checkpoint
and an approval, and an idempotency record, all planted with plaintext
markers. Every verb and option is driven with hostile values: ids with
lone surrogates, NUL, SQL and LIKE metacharacters, empty, huge or
option-like text, numbers of every shape, homes that are missing, files,
unencodable, too long or contain NUL, and junk argv. After every call:

* exit 0, or exit 2 with an argparse usage message, or exit 1 with the
  flowvault error code printed (``error: CODE: ...`` on stderr, or an
  ``error`` object with ``--json``), or the documented verdict of a check
  verb (``doctor`` findings, a ``ledger verify`` failure);
* no exception escaped ``main``, no traceback and no "unexpected" message
  was printed;
* no output carries a planted marker or the store key.

Each call opens the store, so this family runs fewer trials per second than
the service rows; the CI size is 1,000 calls.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import hostile
import pytest
import reliability
from hypothesis import HealthCheck, find, given, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample
from log_capture import reset_flowvault_logging

from flowvault.adapters.cli._io import CommandIO
from flowvault.composition import Settings, bootstrap
from flowvault.composition._cli import main
from flowvault.domain import FlowvaultError, WorkflowState, WorkOrder, content_hash

FAMILY = "Hostile input, CLI arguments"
EXAMPLES = reliability.size(1000, 100_000)
BATCH = 5_000
"""Examples per hypothesis run; each run remembers every choice it made."""
CONTROL_EXAMPLES = 200
CRASHING_COMMANDS = (
    "workflows_show_command",
    "workflows_list_command",
    "runs_show_command",
    "runs_list_command",
    "approvals_show_command",
    "approvals_list_command",
)
"""Browse verbs the negative control breaks, so its search reaches one within its budget."""

SECRETS = (
    "param-secret-4b1f7e",
    "requester-secret-90ad",
    "state-secret-6c2e51",
    "input-secret-d8a3",
    "audience-secret-17fb",
    "response-secret-e02c",
    "result-secret-5a9d",
)
"""Plaintext planted in the home; no output may ever carry one."""

_CODED_ERROR = re.compile(r"^error: [A-Z][A-Z_]+: ", re.MULTILINE)
_USAGE = re.compile(r"^usage: flowvault", re.MULTILINE)


# -- the home ------------------------------------------------------------------------


@dataclass(frozen=True)
class Home:
    """A populated SQLite home, the ids it holds, and the paths hostile runs may use."""

    root: Path
    scratch: Path
    key_text: str
    workflow_id: str
    run_id: str
    approval_id: str
    streams: tuple[str, ...]

    def ids(self) -> tuple[str, ...]:
        """Every id a verb could be pointed at."""
        return (self.workflow_id, self.run_id, self.approval_id, "main", *self.streams)


def _populate(root: Path, scratch: Path) -> Home:
    """Create the home through ``init``, then fill it through the services."""
    assert main(["--home", str(root), "init"]) == 0
    with bootstrap(Settings(home=root), create=True) as vault:
        order = WorkOrder(
            kind="invoice.review",
            parameters={"note": SECRETS[0]},
            requester=SECRETS[1],
            idempotency_key="order-1",
        )
        workflow, _ = vault.workflows.create(order)
        vault.action_results.put_action_result(
            workflow.workflow_id, content_hash("pay"), {"receipt": SECRETS[6]}
        )
        vault.state("main").save(WorkflowState(note=SECRETS[2]))
        vault.definitions.register_definition("flow.main", {"nodes": ["a"]})
        run, _ = vault.runs.start_run("flow.main", {"note": SECRETS[3]})
        vault.runs.set_status(run.run_id, "running", expected_status="accepted")
        checkpoint = vault.checkpoints.create_checkpoint(
            run.run_id,
            1,
            state={"step": 1},
            budgets={},
            counters={},
            dependency_summary=None,
            terminal_cursor=None,
            event_cursor=1,
        )
        approval = vault.approvals.request_approval(
            checkpoint.checkpoint_id,
            expected_state_digest=checkpoint.state_digest,
            expected_budgets={},
            expected_counters={},
            expected_dependency_digest=checkpoint.dependency_digest,
            audience=SECRETS[4],
            prompt_digest=content_hash("prompt"),
            allowed_decisions=["approve", "reject"],
            expires_at=vault.clock.now() + timedelta(days=365),
        )
        vault.idempotency.remember("req-1", {"q": 1}, {"answer": SECRETS[5]})
        streams = tuple(vault.store.list_streams())  # type: ignore[attr-defined]
    return Home(
        root=root,
        scratch=scratch,
        key_text=(root / "keys" / "store.key").read_text().strip(),
        workflow_id=workflow.workflow_id,
        run_id=run.run_id,
        approval_id=approval.approval_id,
        streams=streams,
    )


# -- calling the CLI in process -------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What one in-process run of the console script did."""

    argv: tuple[str, ...]
    code: object
    stdout: str
    stderr: str
    error: BaseException | None = None


def invoke(argv: list[str]) -> Outcome:
    """Run ``flowvault --debug ARGV`` in process, with no terminal and empty stdin."""
    out, err = io.StringIO(), io.StringIO()
    saved_stdin = sys.stdin
    sys.stdin = io.StringIO("")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code: object = main(["--debug", *argv])
            except SystemExit as exit_:
                code = exit_.code
    except Exception as error:  # an exception escaping main is what this looks for
        return Outcome(tuple(argv), None, out.getvalue(), err.getvalue(), error)
    finally:
        sys.stdin = saved_stdin
    return Outcome(tuple(argv), code, out.getvalue(), err.getvalue())


def _json_error(stdout: str) -> bool:
    for line in stdout.splitlines():
        with contextlib.suppress(ValueError):
            document = json.loads(line)
            if isinstance(document, dict) and isinstance(document.get("error"), dict):
                return isinstance(document["error"].get("code"), str)
    return False


def _check_verdict(outcome: Outcome) -> bool:
    """Exit 1 of a check verb: ``doctor`` findings or a ``ledger verify`` failure report."""
    verbs = [token for token in outcome.argv if not token.startswith("-")]
    text = outcome.stdout + outcome.stderr
    if "doctor" in verbs:
        return "error(s) found" in text or '"ok":false' in text
    if "verify" in verbs:
        return "INTEGRITY_FAILURE" in text or '"ok":false' in text
    return False


def _exit_problem(outcome: Outcome) -> str | None:
    """Check the exit status against what the output says happened."""
    if outcome.code == 0:
        return None
    if outcome.code == 2:
        return None if _USAGE.search(outcome.stderr) else "exit 2 without a usage message"
    if outcome.code == 1:
        coded = _CODED_ERROR.search(outcome.stderr) or _json_error(outcome.stdout)
        return None if coded or _check_verdict(outcome) else "exit 1 without an error code"
    return f"exit status {outcome.code!r} is none of 0, 1, 2"


def unrevealed(argv: list[str], forbidden: tuple[str, ...]) -> tuple[str, ...]:
    """Drop the audience from what must not show when ``--reveal`` asked for it in clear.

    ``approvals show --reveal`` prints the approval's audience on purpose;
    every other secret, and the audience without the flag, stays forbidden.
    """
    if "--reveal" not in argv:
        return forbidden
    return tuple(secret for secret in forbidden if secret != SECRETS[4])


def anomaly(outcome: Outcome, forbidden: tuple[str, ...]) -> str | None:
    """Say what is wrong with one run, or ``None`` when it kept every promise."""
    if outcome.error is not None:
        return f"{type(outcome.error).__name__} escaped main: {str(outcome.error)[:160]}"
    text = outcome.stdout + outcome.stderr
    if any(secret in text for secret in forbidden):
        return "output carries a planted secret or the store key"
    if "Traceback (most recent call last)" in text or "rerun with --debug" in text:
        return "output shows a crash"
    return _exit_problem(outcome)


# -- hostile argv ---------------------------------------------------------------------


def values(home: Home) -> st.SearchStrategy[str]:
    """One argv value: real ids, near misses, and hostile text (argv is always text)."""
    return st.one_of(
        hostile.hostile_text(home.ids(), allow_non_text=False),
        st.sampled_from(("-x", "--json", "--", "-", "=", "--limit=1", "-1", "1e3", " ")),
    )


def numbers() -> st.SearchStrategy[str]:
    """Values for ``--limit`` and the ``--*-days`` options."""
    digits = st.one_of(st.sampled_from(hostile.NASTY_INTS), st.integers(-3, 300)).map(str)
    words = st.sampled_from(("1.5", "nan", "inf", "0x10", "", "\u0663", "1_000", " 7 ", "9" * 5000))
    return st.one_of(digits, digits, words, hostile.hostile_text(allow_non_text=False))


def _name(text: str) -> str:
    """Make one path component of hostile text; never ``..`` or a separator."""
    cleaned = text.replace("/", "_")[:200] or "empty"
    return "h-" + cleaned


def homes(home: Home) -> st.SearchStrategy[list[str]]:
    """Draw the global ``--home``: the populated home mostly, else a hostile path."""
    scratch = home.scratch
    hostile_paths = st.one_of(
        hostile.hostile_text(allow_non_text=False).map(lambda text: str(scratch / _name(text))),
        hostile.wild_text().map(lambda text: "~/" + _name(text)),
        st.sampled_from(
            (
                str(scratch / "a-file"),
                str(scratch / "loose"),
                str(scratch / "a\x00b"),
                str(scratch / ("n" * 300)),
                str(scratch / "a-file" / "below"),
                str(home.root / "data"),
                str(home.root / "keys"),
                "~flowvault-no-such-user/home",
                "~",
            )
        ),
    )
    chosen = st.one_of(st.just(str(home.root)), st.just(str(home.root)), hostile_paths)
    backend = st.sampled_from(([], [], ["--backend", "memory"], ["--backend", "sqlite"]))
    return st.builds(lambda path, extra: ["--home", path, *extra], chosen, backend)


def _option(name: str, strategy: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
    return st.one_of(st.just([]), strategy.map(lambda value: [name, value]))


def _flag(name: str) -> st.SearchStrategy[list[str]]:
    return st.sampled_from(([], [name]))


def _verb(*parts: st.SearchStrategy[list[str]]) -> st.SearchStrategy[list[str]]:
    return st.tuples(*parts).map(lambda lists: [token for part in lists for token in part])


def _words(*tokens: str) -> st.SearchStrategy[list[str]]:
    return st.just(list(tokens))


def verbs(home: Home) -> st.SearchStrategy[list[str]]:
    """Every verb with its options filled from hostile values."""
    value, number, json_flag = values(home), numbers(), _flag("--json")
    ids = st.one_of(st.sampled_from(home.ids()), value)
    files = st.one_of(
        hostile.hostile_text(allow_non_text=False).map(lambda t: str(home.scratch / _name(t))),
        st.sampled_from(
            (
                "-",
                str(home.scratch / "a-file"),
                str(home.scratch / "a\x00b"),
                str(home.scratch / ("n" * 300)),
                str(home.root / "data"),
                str(home.root / "keys" / "store.key"),
            )
        ),
    )
    targets = files.map(lambda v: str(home.scratch / "target") if v == "-" else v)
    demo_homes = st.sampled_from(
        (str(home.root), str(home.scratch / "a-file"), str(home.scratch / "a\x00b"))
    )
    return st.one_of(
        _verb(st.sampled_from((["init"], ["status"], ["doctor"])), json_flag),
        _verb(
            _words("workflows", "list"),
            _option("--state", value),
            _option("--limit", number),
            json_flag,
        ),
        _verb(_words("workflows", "show"), ids.map(lambda v: [v]), json_flag),
        _verb(
            _words("runs", "list"),
            _option("--status", value),
            _option("--limit", number),
            json_flag,
        ),
        _verb(_words("runs", "show"), ids.map(lambda v: [v]), json_flag),
        _verb(_words("runs", "recover"), json_flag),
        _verb(
            _words("approvals", "list", "--run"),
            ids.map(lambda v: [v]),
            _option("--status", st.one_of(st.sampled_from(("pending", "decided")), value)),
            _option("--limit", number),
            json_flag,
        ),
        _verb(_words("approvals", "show"), ids.map(lambda v: [v]), _flag("--reveal"), json_flag),
        _verb(
            _words("approvals", "decide"),
            ids.map(lambda v: [v]),
            st.one_of(st.sampled_from(("approve", "reject")), value).map(
                lambda v: ["--decision", v]
            ),
            value.map(lambda v: ["--actor", v]),
            _flag("--yes"),
            _flag("--reveal"),
            json_flag,
        ),
        _verb(
            _words("ledger", "verify"),
            st.one_of(st.just(["--all"]), ids.map(lambda v: ["--stream", v])),
            json_flag,
        ),
        _verb(_words("ledger", "head", "--stream"), ids.map(lambda v: [v]), json_flag),
        _verb(
            _words("ledger", "streams"),
            _option("--limit", number),
            _option("--cursor", value),
            _flag("--all"),
            json_flag,
        ),
        _verb(
            _words("scopes", "list"),
            _option("--limit", number),
            _option("--cursor", value),
            _flag("--all"),
            json_flag,
        ),
        _verb(
            _words("ledger", "vouch", "--stream"),
            ids.map(lambda v: [v]),
            _option("--head-hash", value),
            json_flag,
        ),
        _verb(
            _words("ledger", "verify"),
            files.map(lambda v: ["--against", v]),
            _option("--public-key", files),
            json_flag,
        ),
        _verb(
            _words("ledger", "check-receipt"),
            files.map(lambda v: [v]),
            files.map(lambda v: ["--public-key", v]),
            json_flag,
        ),
        _verb(
            _words("keys", "signing-key", "--out"),
            files.map(lambda v: [str(home.scratch / "out")] if v == "-" else [v]),
            json_flag,
        ),
        _verb(
            _words("fingerprint", "--scope"),
            ids.map(lambda v: [v]),
            _option("--reason", value),
            json_flag,
        ),
        _verb(
            _words("reset-progress", "--scope"),
            ids.map(lambda v: [v]),
            _option("--actor", value),
            _option("--reason", value),
            _flag("--dry-run"),
            _flag("--yes"),
            json_flag,
        ),
        _verb(
            _words("purge"),
            _option("--older-than-days", number),
            _option("--finished-runs-older-than-days", number),
            json_flag,
        ),
        _verb(_words("compact"), json_flag),
        _verb(_words("accept-restore"), _flag("--yes"), json_flag),
        _verb(_words("keys", "list"), json_flag),
        _verb(_words("keys", "add"), json_flag),
        _verb(_words("keys", "retire"), value.map(lambda v: [v]), json_flag),
        _verb(_words("rotate-key"), _option("--batch-size", number), json_flag),
        _verb(
            _words("migrate"),
            targets.map(lambda v: ["--to", v]),
            _option("--to-schema", value),
            json_flag,
        ),
        _verb(
            _words("export"),
            targets.map(lambda v: ["--to", v]),
            _option("--scope", ids),
            _flag("--sign"),
            json_flag,
        ),
        _verb(
            _words("import"),
            files.map(lambda v: [v]),
            _option("--to", targets),
            _option("--public-key", files),
            _flag("--check"),
            json_flag,
        ),
        _verb(_words("demo", "--home"), demo_homes.map(lambda v: [v]), json_flag),
        _verb(
            _words("report", "--html"),
            targets.map(lambda v: [v]),
            st.one_of(
                st.just([]),
                ids.map(lambda v: ["--workflow", v]),
                ids.map(lambda v: ["--run", v]),
                ids.map(lambda v: ["--scope", v]),
            ),
            json_flag,
        ),
    )


JUNK_TOKENS = (
    "workflows", "runs", "approvals", "ledger", "fingerprint", "reset-progress", "purge",
    "status", "doctor", "list", "show", "decide", "verify", "head", "--json", "--limit",
    "--state", "--status", "--run", "--stream", "--all", "--scope", "--reason", "--actor",
    "--decision", "--yes", "--dry-run", "--older-than-days", "--backend", "memory", "-h",
    "keys", "add", "retire", "rotate-key", "--batch-size", "check-receipt", "--against",
    "--public-key", "signing-key", "--out", "compact", "accept-restore", "vouch",
    "--head-hash", "recover", "--sign", "--check", "report", "--html", "--workflow",
    "--reveal", "streams", "scopes", "--cursor",
)  # fmt: skip
"""Words the parser knows, shuffled into junk argv (never ``demo``, which would run in full)."""


def argvs(home: Home) -> st.SearchStrategy[list[str]]:
    """Draw a full argv: hostile global options and a verb, or junk."""
    junk = st.lists(st.one_of(st.sampled_from(JUNK_TOKENS), values(home)), max_size=6)
    verb = st.builds(lambda prefix, words: [*prefix, *words], homes(home), verbs(home))
    mangled = st.builds(lambda prefix, rest: [*prefix, *rest], homes(home), junk)
    return st.sampled_from((verb, verb, verb, mangled)).flatmap(lambda chosen: chosen)


# -- the harness ---------------------------------------------------------------------


@dataclass
class Tally:
    """Calls made and anomalies seen, for the family's one figure."""

    watch: reliability.Stopwatch = field(default_factory=reliability.Stopwatch)
    trials: int = 0
    anomalies: int = 0
    exits: dict[object, int] = field(default_factory=dict)
    crash_caught: bool | None = None
    echo_caught: bool | None = None


@pytest.fixture(scope="module")
def tally() -> Iterator[Tally]:
    """Collect the counts, then record the family's figure once."""
    counts = Tally()
    yield counts
    controls = (counts.crash_caught, counts.echo_caught)
    exits = ", ".join(f"exit {code}: {n}" for code, n in sorted(counts.exits.items(), key=str))
    reliability.record(
        reliability.Figure(
            family=FAMILY,
            trials=counts.trials,
            anomalies=counts.anomalies,
            control_caught=None if None in controls else all(controls),
            detail=f"in-process main() on a populated SQLite home; {exits}",
            seconds=counts.watch.seconds,
        )
    )


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Home]:
    """Provide a populated home, with the environment pointed away from any real one.

    ``~`` is a directory under ``tmp_path``; ``LANGUAGE=C`` spares argparse a
    search for message catalogues on every one of the many parser builds.
    """
    for name in [name for name in os.environ if name.startswith("FLOWVAULT_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.setenv("LANGUAGE", "C")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "a-file").write_text("not a directory\n")
    (scratch / "loose").mkdir(mode=0o777)
    (scratch / "loose").chmod(0o777)
    try:
        yield _populate(tmp_path / "home", scratch)
    finally:
        reset_flowvault_logging()


def _settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        print_blob=False,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.filter_too_much,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
    )


def _hostile_batch(
    home: Home, tally: Tally, forbidden: tuple[str, ...], examples: int, batch: int
) -> None:
    """One hypothesis run under its own seed: a single run of the long size grows without bound."""
    seed_value = reliability.seed_base() + 7 + batch

    @seed(seed_value)
    @_settings(examples)
    @given(argvs(home))
    def holds(argv: list[str]) -> None:
        tally.trials += 1
        outcome = invoke(argv)
        tally.exits[outcome.code] = tally.exits.get(outcome.code, 0) + 1
        found = anomaly(outcome, unrevealed(argv, forbidden))
        if found is not None:
            tally.anomalies += 1
            raise AssertionError(
                f"flowvault {argv!r} (seed {seed_value}, trial {tally.trials}): {found}"
            ) from outcome.error

    holds()


def test_hostile_argv(home: Home, tally: Tally) -> None:
    """Every hostile argv ends in success, a coded error or a usage error, and echoes no secret.

    Afterwards every ledger stream and record of the home still verifies.
    """
    forbidden = (*SECRETS, home.key_text)
    for batch, start in enumerate(range(0, EXAMPLES, BATCH)):
        _hostile_batch(home, tally, forbidden, min(BATCH, EXAMPLES - start), batch)
    assert tally.anomalies == 0
    audit = invoke(["--home", str(home.root), "ledger", "verify", "--all", "--json"])
    assert audit.code == 0, f"the home no longer verifies after the hostile calls: {audit.stdout}"


# -- what the family found -----------------------------------------------------------


def found_argvs(home: Home) -> tuple[list[str], ...]:
    """Return argv that crashed ``main`` before the fixes the report lists."""
    scratch, root = home.scratch, str(home.root)
    return (
        ["--home", str(scratch / "a\x00b"), "init"],
        ["--home", str(scratch / "h-\ud800"), "init"],
        ["--home", "~flowvault-no-such-user/home", "status"],
        ["--home", root, "demo", "--home", str(scratch / "a\x00b")],
        ["--home", root, "demo", "--home", str(scratch / "h-\ud800")],
    )


def test_found_argv_stay_fixed(home: Home) -> None:
    """Each argv that once escaped ``main`` as a bare exception now ends in a coded error."""
    forbidden = (*SECRETS, home.key_text)
    for argv in found_argvs(home):
        outcome = invoke(argv)
        assert anomaly(outcome, forbidden) is None, (argv, outcome.error)
        assert outcome.code == 1, (argv, outcome.stderr)


# -- negative controls ----------------------------------------------------------------


def _caught(home: Home, forbidden: tuple[str, ...]) -> str | None:
    """Search hostile argv for a run the checker rejects; return what it said."""
    found: list[str] = []

    def breaks(argv: list[str]) -> bool:
        verdict = anomaly(invoke(argv), forbidden)
        if verdict is not None:
            found.append(verdict)
        return verdict is not None

    try:
        find(argvs(home), breaks, settings=_settings(CONTROL_EXAMPLES))
    except NoSuchExample:
        return None
    return found[-1]


def test_negative_controls(home: Home, tally: Tally, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same checker catches a verb that crashes and an error path that echoes a secret."""
    forbidden = (*SECRETS, home.key_text)

    def crashing(*_: Any) -> int:
        raise KeyError("a bug in a command")

    with monkeypatch.context() as patch:
        for command in CRASHING_COMMANDS:
            group = command.split("_")[0]
            patch.setattr(f"flowvault.adapters.cli._{group}.{command}", crashing)
        crash = _caught(home, forbidden)
    tally.crash_caught = crash is not None and "KeyError escaped" in crash

    honest_fail: Callable[[CommandIO, FlowvaultError], int] = CommandIO.fail

    def echoing(self: CommandIO, error: FlowvaultError) -> int:
        self.err.write(f"context: {SECRETS[0]}\n")
        return honest_fail(self, error)

    with monkeypatch.context() as patch:
        patch.setattr(CommandIO, "fail", echoing)
        echo = _caught(home, forbidden)
    tally.echo_caught = echo is not None and "secret" in echo

    assert tally.crash_caught, f"a crashing verb was not caught: {crash}"
    assert tally.echo_caught, f"an echoed secret was not caught: {echo}"
