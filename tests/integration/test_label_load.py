"""The SQL adapters' ``load_by_label``: one statement, the rows it returns, index rows checked.

The contract kit holds what the records must be; this holds how the bundled
SQL adapters get them: the label listing's own statement with the payloads
added, reading no row past the limit, and refusing a label row that names
a record not carrying the label.
"""

from __future__ import annotations

from typing import Any

import pytest

from flowvault.application import StoreCapabilities, UnitOfWork
from flowvault.application.testing import make_upsert
from flowvault.domain import IntegrityFailure

NS = "by-label"


def _write(store: Any, count: int) -> None:
    store.commit(
        UnitOfWork(
            upserts=[
                make_upsert(NS, f"k{n:02d}", f"sealed {n}".encode(), labels={"pos": f"p{n:02d}"})
                for n in range(count)
            ]
        )
    )


def test_one_statement_reads_the_records_and_no_row_past_the_limit(
    sql_backend: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The newest by a label comes with its payload in one statement that returns one row."""
    store, _ = sql_backend
    _write(store, 12)
    fetched: list[list[Any]] = []
    fetch = store._fetch

    def counted(statement: str, params: Any) -> list[Any]:
        rows: list[Any] = fetch(statement, params)
        fetched.append(rows)
        return rows

    monkeypatch.setattr(store, "_fetch", counted)
    loaded = store.load_by_label(NS, "pos", descending=True)
    assert [record.payload for record in loaded] == [b"sealed 11"]
    assert [len(rows) for rows in fetched] == [1]
    fetched.clear()
    three = store.load_by_label(NS, "pos", limit=3)
    assert [record.payload for record in three] == [b"sealed 0", b"sealed 1", b"sealed 2"]
    assert [len(rows) for rows in fetched] == [3]
    assert StoreCapabilities.of(store).label_load is store


def test_a_label_row_moved_onto_another_record_fails_the_load(sql_backend: tuple[Any, Any]) -> None:
    """An index row claiming a record carries a value its own labels do not is IntegrityFailure."""
    store, raw = sql_backend
    _write(store, 3)
    raw(
        "UPDATE record_labels SET text_value = ? WHERE namespace = ? AND text_value = ?",
        ("p99", NS, "p00"),
    )
    with pytest.raises(IntegrityFailure, match="label index disagrees"):
        store.load_by_label(NS, "pos", descending=True)
