"""Every error code prints its own one-line fix on the CLI, none shared and none destructive."""

from __future__ import annotations

import io
from pathlib import Path

from flowvault import domain
from flowvault.adapters.cli._io import FIXES, CommandIO
from flowvault.domain import FlowvaultError, IntegrityFailure


def _codes() -> set[str]:
    return {
        getattr(domain, name).code
        for name in domain.__all__
        if isinstance(getattr(domain, name), type)
        and issubclass(getattr(domain, name), FlowvaultError)
    }


def test_every_code_has_a_fix() -> None:
    """Each code the domain exports has a non-empty fix, and the table names no other code."""
    codes = _codes()
    assert len(codes) >= 28
    assert set(FIXES) == codes
    assert all(FIXES[code].strip() for code in codes)


def test_no_two_codes_share_a_fix() -> None:
    """A fix says what to do about its own code, so no text serves two of them."""
    assert len(set(FIXES.values())) == len(FIXES)


def test_the_integrity_fix_points_at_the_key_before_any_restore() -> None:
    """A wrong key reads as INTEGRITY_FAILURE: the fix names the key first and destroys nothing."""
    fix = FIXES["INTEGRITY_FAILURE"]
    assert fix.index("FLOWVAULT_KEY") < fix.index("restore")
    assert "reset" not in fix
    assert "delete" not in fix


def test_an_error_prints_its_code_fix_unless_it_carries_its_own() -> None:
    """``details["fix"]`` wins over the table; without it the code's line is printed."""
    err = io.StringIO()
    CommandIO(out=io.StringIO(), err=err).fail(IntegrityFailure("bad"))
    assert err.getvalue().splitlines()[1] == f"  fix: {FIXES['INTEGRITY_FAILURE']}"
    err = io.StringIO()
    CommandIO(out=io.StringIO(), err=err).fail(IntegrityFailure("bad", fix="do this"))
    assert err.getvalue().splitlines()[1] == "  fix: do this"


def test_the_cli_reference_lists_every_fix() -> None:
    """docs/cli.md's table shows each code with the very line the CLI prints."""
    text = (Path(__file__).parents[2] / "docs" / "cli.md").read_text(encoding="utf-8")
    for code, fix in FIXES.items():
        assert f"| `{code}` | {fix} |" in text, code
