"""What a new user meets first: ``--version``, options after the verb, a quick ``--help``, Ctrl-C.

Real subprocesses of the installed console script. ``--help`` is checked by
what it imports, not by a stopwatch: it must not import the library a verb
runs (pydantic models, the services, the crypto backend, the log set-up).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from cli_helpers import FLOWVAULT, TIMEOUT, cli_env, json_document, run_cli

from flowvault.adapters.cli import _grammar
from flowvault.adapters.cli._catalog import VERB_GROUPS, register_group
from flowvault.adapters.cli._verbs import DeferredType, resolve
from flowvault.application._keys import KEY_ENV
from flowvault.application._rotation import DEFAULT_BATCH, MAX_BATCH
from flowvault.composition import Settings, bootstrap
from flowvault.composition._cli import EXIT_INTERRUPTED, build_parser
from flowvault.domain import ApprovalStatus, WorkflowState
from flowvault.domain._graph_runs import RUN_LIFECYCLE

HEAVY = (
    "pydantic",
    "flowvault.domain",
    "flowvault.application",
    "cryptography",
    "structlog",
    "rich",
)
"""What a verb's run imports and ``--help``, ``--version`` or a usage error must not."""


def test_version_names_the_installed_release(tmp_path: Path) -> None:
    """``--version`` prints the distribution's version and exits 0, before or without a verb."""
    result = run_cli(tmp_path, "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"flowvault {version('flowvault')}"


def _verb_paths() -> list[list[str]]:
    """Every verb and sub-verb as the words that name it (``["approvals", "list"]``)."""
    paths: list[list[str]] = []

    def walk(parser: argparse.ArgumentParser, words: list[str]) -> None:
        groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not groups:
            paths.append(words)
        for group in groups:
            for name, sub in group.choices.items():
                walk(sub, [*words, name])

    walk(build_parser(), [])
    return paths


def _heavy_imports(argv: list[str]) -> list[str]:
    script = (
        "import sys\n"
        "from flowvault.composition._cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r} "
        f"or m.startswith({HEAVY!r})))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=TIMEOUT, check=False
    )
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout.strip().splitlines()[-1].replace("'", '"')))


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["--version"], ["no-such-verb"], []],
    ids=["help", "version", "usage", "none"],
)
def test_help_version_and_usage_import_no_verb(argv: list[str]) -> None:
    """The parser lists every verb by name alone; none of the library is imported for it."""
    assert _heavy_imports(argv) == []


@pytest.mark.parametrize("words", _verb_paths(), ids=" ".join)
def test_a_verbs_own_help_imports_none_of_what_it_runs(words: list[str]) -> None:
    """``flowvault VERB [SUB] --help`` needs the grammar alone, not the verb's module."""
    assert _heavy_imports([*words, "--help"]) == []


def test_every_handler_and_argument_type_the_grammar_names_exists() -> None:
    """A handler or type is named by text in the grammar: each must resolve to a function."""
    names: list[str] = []

    def walk(parser: argparse.ArgumentParser) -> None:
        handler = parser.get_default("handler")
        if handler is not None:
            names.append(handler)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    walk(sub)
            elif isinstance(action.type, DeferredType):
                names.append(action.type.reference)

    walk(build_parser())
    assert len(names) >= len(_verb_paths())
    for name in names:
        assert callable(resolve(name)), name


def test_the_grammars_literals_match_the_library() -> None:
    """Choices and limits the grammar repeats, so as not to import them, equal their source."""
    assert tuple(status.value for status in ApprovalStatus) == _grammar.APPROVAL_STATUSES
    assert tuple(sorted(RUN_LIFECYCLE.states)) == _grammar.RUN_STATUSES
    assert (_grammar.DEFAULT_BATCH, _grammar.MAX_BATCH) == (DEFAULT_BATCH, MAX_BATCH)
    assert _grammar.KEY_ENV == KEY_ENV


def test_help_lists_every_verb_with_its_line(tmp_path: Path) -> None:
    """Top-level ``--help`` shows each verb of the catalog with its one-line help."""
    result = run_cli(tmp_path, "--help")
    assert result.returncode == 0, result.stderr
    for _, verbs in VERB_GROUPS:
        for name, line in verbs:
            assert name in result.stdout
            assert " ".join(line.split()[:3]) in " ".join(result.stdout.split())
    assert "130" in result.stdout, "the Ctrl-C exit code is in the epilog"


def test_each_group_registers_exactly_its_catalogued_verbs() -> None:
    """The catalog the parser lists without the grammar matches what each group adds."""
    for module, verbs in VERB_GROUPS:
        parser = argparse.ArgumentParser()
        group = parser.add_subparsers()
        register_group(group, module)
        assert sorted(group.choices) == sorted(name for name, _ in verbs), module


def test_global_options_work_before_or_after_the_verb(tmp_path: Path) -> None:
    """``--home`` and ``--backend`` after a verb, or a sub-verb, mean what they mean before it."""
    home = tmp_path / "home"
    assert run_cli(tmp_path, "init", "--json", home=home).returncode == 0
    before = run_cli(tmp_path, "--home", str(home), "status", "--json")
    after = run_cli(tmp_path, "status", "--json", "--home", str(home), "--backend", "sqlite")
    assert before.returncode == after.returncode == 0, before.stderr + after.stderr
    assert json_document(before) == json_document(after)
    assert json_document(after)["cold_root"] is False
    nested = run_cli(tmp_path, "workflows", "list", "--home", str(home), "--json")
    assert nested.returncode == 0, nested.stderr
    assert json_document(nested)["cold_root"] is False
    overridden = run_cli(
        tmp_path, "--home", str(tmp_path / "elsewhere"), "status", "--home", str(home), "--json"
    )
    assert json_document(overridden)["home"] == str(home), "the option after the verb wins"


def _filled_home(tmp_path: Path, scopes: int) -> Path:
    home = tmp_path / "home"
    settings = Settings(home=home, synchronous="normal")
    with bootstrap(settings, create=True) as runtime:
        for scope in range(scopes):
            runtime.state(f"scope-{scope}").save(WorkflowState(step=scope))
    return home


def test_ctrl_c_mid_rotation_ends_in_one_line_and_leaves_a_store_that_verifies(
    tmp_path: Path,
) -> None:
    """SIGINT after the first re-sealed batch: exit 130, one line, no traceback; rerun finishes."""
    home = _filled_home(tmp_path, 2000)
    assert run_cli(tmp_path, "keys", "add", home=home).returncode == 0
    rotation = subprocess.Popen(
        [str(FLOWVAULT), "--home", str(home), "rotate-key", "--batch-size", "10"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=cli_env(tmp_path, FLOWVAULT_PROGRESS_INTERVAL="0"),
    )
    assert rotation.stderr is not None
    first = rotation.stderr.readline()
    assert first.startswith("re-sealed"), first
    rotation.send_signal(signal.SIGINT)
    rest = rotation.stderr.read()
    assert rotation.wait(TIMEOUT) == EXIT_INTERRUPTED
    lines = [line for line in rest.splitlines() if not line.startswith("re-sealed")]
    assert len(lines) == 1, rest
    assert lines[0].startswith("flowvault: interrupted"), rest
    assert "Traceback" not in rest

    verified = run_cli(tmp_path, "ledger", "verify", "--all", "--json", home=home)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    keys = json.loads(run_cli(tmp_path, "keys", "list", "--json", home=home).stdout)
    pending = sum(key["records"] for key in keys["keys"] if key["role"] != "primary")
    assert pending > 0, "the interrupt came before the rotation was done"
    finished = run_cli(tmp_path, "rotate-key", "--json", home=home)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert json_document(finished)["remaining"] == 0
