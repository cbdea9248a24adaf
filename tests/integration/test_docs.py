"""Every code example in the README and docs runs as written, and type-checks as a host's would."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import cli_env

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"```python\n(.*?)```", re.DOTALL)
DOCUMENTS = ["README.md", *(f"docs/{path.name}" for path in sorted((ROOT / "docs").glob("*.md")))]
MY_APP_STORAGE = """\
from pathlib import Path

from flowvault.adapters.memory import InMemorySecureObjectStore


class MyStore(InMemorySecureObjectStore):
    def __init__(self, path: Path | str) -> None:
        super().__init__()
"""
"""The host module the adapter guide's snippets import, as a host would write it."""


def _python_blocks(name: str) -> list[str]:
    return FENCE.findall((ROOT / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    "name",
    [
        "README.md",
        "docs/workflows.md",
        "docs/state.md",
        "docs/approvals.md",
        "docs/domain.md",
        "docs/async.md",
    ],
)
def test_usage_examples_run(name: str) -> None:
    """The Python examples of the README and the workflow guide execute without error."""
    blocks = _python_blocks(name)
    assert blocks
    for block in blocks:
        exec(compile(block, name, "exec"), {})  # noqa: S102 - running our own docs


def test_adapter_guide_example_runs_the_kit(tmp_path: Path) -> None:
    """The adapter guide's snippet collects and passes the whole contract kit."""
    block, sealing, _durability = _python_blocks("docs/adapters.md")
    assert len(block.strip().splitlines()) < 15
    package = tmp_path / "my_app"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "storage.py").write_text(
        "from flowvault.adapters.memory import InMemorySecureObjectStore\n\n"
        "class MyStore(InMemorySecureObjectStore):\n"
        "    def __init__(self, path):\n"
        "        super().__init__()\n"
    )
    (tmp_path / "test_my_store_contract.py").write_text(block)
    (tmp_path / "test_my_store_sealing.py").write_text(sealing)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    passed = int(re.search(r"(\d+) passed", result.stdout).group(1))  # type: ignore[union-attr]
    assert passed >= 55


def test_adapter_guide_durability_example_runs(tmp_path: Path) -> None:
    """The guide's durability snippet binds a reopenable store and passes."""
    *_, block = _python_blocks("docs/adapters.md")
    package = tmp_path / "my_app"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "storage.py").write_text(
        "from pathlib import Path\n\n"
        "from flowvault.adapters.sqlite import SQLiteSecureObjectStore\n\n"
        "def MyStore(path):\n"
        "    return SQLiteSecureObjectStore.open(Path(path), create=True)\n"
    )
    (tmp_path / "test_my_store_durability.py").write_text(block)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert "2 passed" in result.stdout


def test_every_snippet_passes_mypy_strict_without_plugins(tmp_path: Path) -> None:
    """A host running plain ``mypy --strict`` (no pydantic plugin) on the docs' code sees no error.

    Every ``python`` block of the README and docs/ is checked, in one run,
    under a configuration that names no plugin; the adapter guide's
    snippets get the ``my_app.storage`` module they import.
    """
    sources = tmp_path / "snippets"
    (sources / "my_app").mkdir(parents=True)
    (sources / "my_app" / "__init__.py").write_text("")
    (sources / "my_app" / "storage.py").write_text(MY_APP_STORAGE)
    files = []
    for name in DOCUMENTS:
        for number, block in enumerate(_python_blocks(name)):
            path = sources / f"{Path(name).stem.lower()}_{number}.py"
            path.write_text(block)
            files.append(path.name)
    assert len(files) >= 20
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\nstrict = True\n")
    assert "plugins" not in config.read_text()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(config),
            "--strict",
            "--cache-dir",
            str(tmp_path / "cache"),
            *files,
        ],
        cwd=sources,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


def test_readme_common_flows_are_short() -> None:
    """The README's first three examples (typed state, one approval, resume) stay a few lines each.

    Imports aside, each is at most 11 lines: the facade's promise to a host.
    """
    flows = _python_blocks("README.md")[:3]
    assert "model=Cart" in flows[0]
    assert "decide_and_resume" in flows[1]
    assert "resume_from" in flows[2]
    for flow in flows:
        code = [
            line
            for line in flow.splitlines()
            if line.strip() and not line.startswith(("import ", "from "))
        ]
        assert len(code) <= 11, flow


def _cli_tour() -> str:
    """Return the README's CLI tour, the ``sh`` block under "The CLI"."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("### The CLI") :]
    match = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert match is not None
    return match.group(1)


def test_readme_cli_tour_runs_as_written(tmp_path: Path) -> None:
    """Every line of the tour, from activating the venv on, exits 0 in a fresh directory.

    The directory holds a ``.venv`` whose ``bin/activate`` puts the
    interpreter's own ``bin`` (where ``flowvault`` is installed) first on
    ``PATH``, as a fresh clone's ``make demo`` would; no ``FLOWVAULT_*``
    variable comes from outside.
    """
    tour = _cli_tour()
    assert tour.startswith(". .venv/bin/activate")
    assert "flowvault init" in tour  # named, so a reader knows how to start empty
    bin_dir = Path(sys.executable).parent
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "activate").write_text(f'export PATH="{bin_dir}:$PATH"\n')
    script = "set -eo pipefail\ntrap 'echo \"failed: $BASH_COMMAND\" >&2' ERR\n" + tour
    environ = cli_env(tmp_path, TMPDIR=str(tmp_path))
    environ["PATH"] = "/usr/bin:/bin"
    result = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        env=environ,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "receipt: ok, signed" in result.stdout
    assert (tmp_path / "r").read_text().strip()


def test_langgraph_guide_examples_run(tmp_path: Path) -> None:
    """The LangGraph guide's openers run; its graph pauses, then resumes in a new process."""
    opener, conn_string, graph, approvals = _python_blocks("docs/langgraph.md")
    for block in (opener, conn_string, approvals):
        exec(compile(block, "docs/langgraph.md", "exec"), {})  # noqa: S102 - running our own docs
    script = tmp_path / "refund.py"
    script.write_text(graph)
    env = cli_env(tmp_path, FLOWVAULT_HOME=str(tmp_path / "home"), FLOWVAULT_LOG_LEVEL="warning")
    runs = [
        subprocess.run(
            [sys.executable, str(script), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
        for args in ([], ["resume"])
    ]
    assert [run.returncode for run in runs] == [0, 0], [run.stderr for run in runs]
    assert [run.stdout for run in runs] == ["waiting for approval\n", "refunded\n"]
