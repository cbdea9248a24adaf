"""What the browse verbs (workflows, runs, approvals) share: pages, cells and cold roots.

Every browse verb prints identifiers, states, counts, times and digests
only: never work-order parameters, run inputs or states, audiences, actors
or decisions in clear. A service is ``None`` on a cold root, where lists
are empty and ``show``/``decide`` report ``NOT_FOUND``; nothing is created.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from flowvault.adapters.cli._context import CliContext, Services
from flowvault.adapters.cli._io import CommandIO
from flowvault.application import Page
from flowvault.domain import JsonValue, LedgerEvent, NotFound
from flowvault.domain._envelope import format_instant

Fields = dict[str, JsonValue]
T = TypeVar("T")
S = TypeVar("S")

COLD_ROOT = "cold root: no store exists yet"


def with_service(
    context: CliContext, pick: Callable[[Services], S], call: Callable[[S | None], int]
) -> int:
    """Open the store if it exists and hand ``call`` one service, or ``None`` on a cold root."""
    services = context.open_existing()
    if services is None:
        return call(None)
    with services:
        return call(pick(services))


def instant(moment: datetime | None) -> str | None:
    return None if moment is None else format_instant(moment)


def cell_text(value: JsonValue) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def detail_lines(title: str, fields: Mapping[str, JsonValue]) -> list[str]:
    return [title, *(f"  {name}: {cell_text(value)}" for name, value in fields.items())]


def cold_not_found(what: str) -> NotFound:
    return NotFound(f"no such {what} ({COLD_ROOT})")


@dataclass(frozen=True, slots=True)
class PageRequest:
    """Which page a ``list`` verb prints: from ``cursor`` (or the start), or every page."""

    limit: int
    cursor: str | None = None
    all_pages: bool = False


def read_pages(fetch: Callable[[str | None], Page[T]], request: PageRequest) -> Page[T]:
    """Read the requested page, or with ``all_pages`` every page from the cursor on."""
    page = fetch(request.cursor)
    if not request.all_pages:
        return page
    items, unreadable = list(page.items), list(page.unreadable)
    while page.next_cursor is not None:
        page = fetch(page.next_cursor)
        items += page.items
        unreadable += page.unreadable
    return Page(tuple(items), tuple(unreadable), None)


def print_listing(
    io: CommandIO,
    noun: str,
    columns: Sequence[str],
    page: Page[Fields] | None,
) -> int:
    """Print rows, then the next cursor and the unreadable items; exit 1 if any was unreadable.

    ``page`` is ``None`` on a cold root. An empty result says so.
    """
    rows = [] if page is None else list(page.items)
    unreadable = () if page is None else page.unreadable
    next_cursor = None if page is None else page.next_cursor
    if io.json_output:
        document = {
            noun: rows,
            "count": len(rows),
            "cold_root": page is None,
            "next_cursor": next_cursor,
            "unreadable": [
                {"key_digest": item.key_digest, "code": item.code} for item in unreadable
            ],
        }
        io.emit(document, [])
    elif rows:
        io.table(noun, columns, [[cell_text(row[column]) for column in columns] for row in rows])
    else:
        io.say(f"no {noun}" + (f" ({COLD_ROOT})" if page is None else ""))
    if next_cursor is not None:
        io.say(f"next_cursor: {next_cursor}")
    for item in unreadable:
        io.say(f"unreadable: {item.key_digest} {item.code}")
    return 1 if unreadable else 0


def page_rows(page: Page[T], row: Callable[[T], Fields]) -> Page[Fields]:
    return Page(tuple(map(row, page.items)), page.unreadable, page.next_cursor)


EVENT_COLUMNS = ("index", "type", "from_state", "to_state", "occurred_at", "event_hash")


def attribute_row(item: object, columns: Sequence[str]) -> Fields:
    """Return the attributes a listing's columns name, each time as an instant.

    Only what the columns name is read, so a row can never carry a field
    the listing did not choose to show.
    """
    row: Fields = {}
    for column in columns:
        value = getattr(item, column)
        row[column] = instant(value) if isinstance(value, datetime) else value
    return row


def event_row(event: LedgerEvent) -> Fields:
    """Return an event's position, type, states, time and hash: never its payload."""
    return attribute_row(event, EVENT_COLUMNS)


def page_request(args: argparse.Namespace) -> PageRequest:
    return PageRequest(limit=args.limit, cursor=args.cursor, all_pages=args.all)
