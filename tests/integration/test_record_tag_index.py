"""The SQL adapters' tag storage: the index answers tag filters, and edits of it or of a row fail.

``records.tags`` is what reads return (checked against the sealed copy when
a record is opened); ``record_tags`` only selects rows for a tag filter, so
an index row edited to point a tag at another record is caught when the
listed row's own tags do not carry it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.sqlite import SQLiteSecureObjectStore
from flowvault.adapters.sqlite import _queries as sqlite_sql
from flowvault.application import Guard, Order, SealedRepository, SecureObjectStore, TagFilter
from flowvault.application.testing import FrozenClock
from flowvault.domain import IntegrityFailure

NS = "tagged"
RED, BLUE = "sha256:" + "1" * 64, "sha256:" + "2" * 64


def _repository(store: SecureObjectStore) -> SealedRepository:
    return SealedRepository(store, AesGcmCipher(b"k" * 32), FrozenClock())


def test_an_index_row_pointing_a_tag_at_another_record_fails_the_listing(
    sql_backend: tuple[Any, Any],
) -> None:
    """A ``record_tags`` row naming a record that does not carry the tag is IntegrityFailure."""
    store, raw = sql_backend
    repo = _repository(store)
    repo.write(NS, "red", {"n": 1}, expected=Guard.ABSENT, tags={RED}, labels={"n": 1})
    repo.write(NS, "blue", {"n": 2}, expected=Guard.ABSENT, tags={BLUE}, labels={"n": 2})
    assert len(store.list(NS, filters=[TagFilter(RED)]).items) == 1
    raw(
        "INSERT INTO record_tags (record_id, namespace, tag) "
        "SELECT id, namespace, ? FROM records WHERE key_digest = ?",
        (RED, repo.key_digest(NS, "blue")),
    )
    with pytest.raises(IntegrityFailure) as caught:
        store.list(NS, filters=[TagFilter(RED)])
    assert caught.value.details == {"table": "record_tags"}
    with pytest.raises(IntegrityFailure):
        store.list_by_label(NS, "n", filters=[TagFilter(RED)])


def test_an_edited_tags_column_no_longer_opens(sql_backend: tuple[Any, Any]) -> None:
    """A row whose ``records.tags`` gained a tag lists under it, but refuses to open."""
    store, raw = sql_backend
    repo = _repository(store)
    repo.write(NS, "a", {"n": 1}, expected=Guard.ABSENT, tags={RED})
    raw(
        "UPDATE records SET tags = ? WHERE key_digest = ?",
        (f'["{RED}","{BLUE}"]', repo.key_digest(NS, "a")),
    )
    meta = store.peek_metadata(NS, repo.key_digest(NS, "a"))
    assert meta is not None
    assert meta.tags == {RED, BLUE}
    with pytest.raises(IntegrityFailure, match="tags differ"):
        repo.read(NS, "a")


def test_a_malformed_tags_column_is_integrity_failure(sql_backend: tuple[Any, Any]) -> None:
    """A tags column that is not a list of keyed digests reads as a malformed row."""
    store, raw = sql_backend
    repo = _repository(store)
    repo.write(NS, "a", {"n": 1}, expected=Guard.ABSENT, tags={RED})
    for bad in ('["colour=red"]', '{"a": 1}', "[7]"):
        raw("UPDATE records SET tags = ? WHERE key_digest = ?", (bad, repo.key_digest(NS, "a")))
        with pytest.raises(IntegrityFailure):
            store.peek_metadata(NS, repo.key_digest(NS, "a"))


def test_a_tag_filter_searches_the_tag_index(tmp_path: Path) -> None:
    """SQLite answers a tag filter from ``record_tags_by_tag``, scanning no table."""
    with SQLiteSecureObjectStore.open(tmp_path / "store.db", create=True) as store:
        repo = _repository(store)
        for n in range(50):
            repo.write(NS, f"r{n}", n, expected=Guard.ABSENT, tags={RED} if n % 2 else {BLUE})
        for order in Order:
            query = sqlite_sql.list_query(order, False, (), 2)
            plan = [
                row[3]
                for row in store._writer.connection.execute(
                    f"EXPLAIN QUERY PLAN {query}", (NS, NS, RED, NS, BLUE, 5)
                )
            ]
            assert any("record_tags_by_tag" in step for step in plan), plan
            assert not any(step.startswith(("SCAN record_tags", "SCAN t")) for step in plan), plan
