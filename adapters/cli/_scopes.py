"""``flowvault scopes list``: the workflow state scopes, from their history streams.

Every state write appends to the scope's stream ``scope/<name>``, so the
streams name every scope that holds state or has held it. A scope name is
kept in the clear in its stream's name (``docs/security.md``); nothing
sealed is opened and no key is needed.
"""

from __future__ import annotations

import argparse

from flowvault.adapters.cli._context import CliContext
from flowvault.adapters.cli._io import CommandIO
from flowvault.adapters.cli._ledger import stream_listing
from flowvault.adapters.cli._listing import (
    Fields,
    page_request,
    print_listing,
)
from flowvault.application import Page

SCOPE_PREFIX = "scope/"
SCOPE_COLUMNS = ("scope", "stream", "size")


def _scope_row(row: Fields) -> Fields:
    stream = str(row["stream"])
    return {"scope": stream.removeprefix(SCOPE_PREFIX), "stream": stream, "size": row["size"]}


def _scopes_list(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    request = page_request(args)
    if context.is_cold_root():
        return print_listing(io, "scopes", SCOPE_COLUMNS, None)
    cursor = None if request.cursor is None else SCOPE_PREFIX + request.cursor
    store = context.open_store(read_only=True)
    try:
        page = stream_listing(
            store,
            cursor=cursor,
            limit=request.limit,
            all_pages=request.all_pages,
            prefix=SCOPE_PREFIX,
        )
    finally:
        store.close()
    rows = tuple(_scope_row(row) for row in page.items)
    after = None if page.next_cursor is None else page.next_cursor.removeprefix(SCOPE_PREFIX)
    return print_listing(io, "scopes", SCOPE_COLUMNS, Page(rows, (), after))
