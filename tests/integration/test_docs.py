"""Every code example in the README and docs runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"```python\n(.*?)```", re.DOTALL)


def _python_blocks(name: str) -> list[str]:
    return FENCE.findall((ROOT / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    "name",
    ["README.md", "docs/workflows.md", "docs/state.md", "docs/approvals.md", "docs/domain.md"],
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
