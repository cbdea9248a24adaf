"""Identifiers match their whole text: a trailing newline is not quietly part of a valid id.

``re.match`` with ``$`` accepts a run id followed by a newline; two ids that differ only
by it would name different records while printing the same.
"""

from __future__ import annotations

import pytest

from flowvault.application._keys import parse_master_key
from flowvault.application._runs import check_run_id
from flowvault.application._state import check_scope
from flowvault.domain import InvalidInput, LedgerEvent
from flowvault.domain._envelope import _check_digest
from flowvault.domain._ledger import GENESIS_HASH


@pytest.mark.parametrize("suffix", ["\n", "\r\n", " "])
def test_run_ids_and_scopes_refuse_trailing_whitespace(suffix: str) -> None:
    """The valid forms pass; the same text with a line end does not."""
    assert check_run_id("run-001") == "run-001"
    assert check_scope("main") == "main"
    with pytest.raises(InvalidInput):
        check_run_id("run-001" + suffix)
    with pytest.raises(InvalidInput):
        check_scope("main" + suffix)


def test_digests_refuse_a_trailing_newline() -> None:
    """A digest is exactly ``sha256:`` and 64 lowercase hex digits."""
    assert _check_digest(GENESIS_HASH) == GENESIS_HASH
    with pytest.raises(ValueError, match="sha256"):
        _check_digest(GENESIS_HASH + "\n")


def test_a_ledger_event_refuses_a_previous_hash_with_a_newline() -> None:
    """The chain link is compared byte for byte, so it must be canonical."""
    from datetime import UTC, datetime  # noqa: PLC0415

    with pytest.raises(InvalidInput):
        LedgerEvent.create(
            stream="s",
            index=1,
            type="t.x",
            occurred_at=datetime(2026, 1, 1, tzinfo=UTC),
            payload={},
            previous_hash="sha256:" + "a" * 64 + "\n",
        )


def test_a_key_file_may_end_with_a_newline() -> None:
    """Key text is stripped before it is matched, as a key file written by ``echo`` ends in one."""
    key = parse_master_key("A" * 43 + "=\n", source="FLOWVAULT_KEY")
    assert len(key) == 32
