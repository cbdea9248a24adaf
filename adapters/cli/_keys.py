"""``flowvault keys`` and ``rotate-key``: show the key ring, add and retire keys, re-seal.

The command functions receive facts and services from the composition root
and format them; they print key ids, roles and counts, never key material.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from flowvault.adapters.cli._io import CommandIO
from flowvault.application import KeyRotation, RotationReport

PRIMARY = "primary"
OPEN_ONLY = "open-only"
MISSING = "missing"
"""Role of a key id that records name but the ring lacks: those records cannot be read."""


@dataclass(frozen=True, slots=True)
class KeyEntry:
    """One key id as ``keys list`` shows it."""

    key_id: str
    role: str
    records: int
    seals: int | None


def key_entries(
    primary: str,
    previous: Sequence[str],
    records: Mapping[str, int],
    seals: Mapping[str, int] | None,
) -> list[KeyEntry]:
    """Return the ring's keys, primary first, then ids that records name but the ring lacks."""
    ring = [(primary, PRIMARY), *((key_id, OPEN_ONLY) for key_id in previous)]
    known = {key_id for key_id, _ in ring}
    ring.extend((key_id, MISSING) for key_id in sorted(records) if key_id not in known)
    return [
        KeyEntry(
            key_id=key_id,
            role=role,
            records=records.get(key_id, 0),
            seals=None if seals is None else seals.get(key_id, 0),
        )
        for key_id, role in ring
    ]


def _entry_document(entry: KeyEntry) -> dict[str, object]:
    return {
        "key_id": entry.key_id,
        "role": entry.role,
        "records": entry.records,
        "seals": entry.seals,
    }


def keys_list_command(entries: Sequence[KeyEntry], *, limit: int, io: CommandIO) -> int:
    """Print every key id with its role, records sealed under it and seals counted."""
    document = {"keys": [_entry_document(entry) for entry in entries], "seal_limit": limit}
    if io.json_output:
        io.emit(document, [])
        return 0
    io.table(
        "key ring",
        ["key id", "role", "records", "seals"],
        [
            (entry.key_id, entry.role, entry.records, "-" if entry.seals is None else entry.seals)
            for entry in entries
        ],
    )
    io.say(f"seal limit per key: {limit}")
    if any(entry.role == MISSING for entry in entries):
        io.say("records under a missing key cannot be read: restore that key into the ring")
    return 0


def keys_add_command(entries: Sequence[KeyEntry], io: CommandIO) -> int:
    """Report the new primary key and what is left to re-seal."""
    primary = entries[0]
    pending = sum(entry.records for entry in entries if entry.role != PRIMARY)
    io.emit(
        {"added": primary.key_id, "pending": pending},
        [
            f"added key {primary.key_id} as the primary key: new writes are sealed under it",
            f"{pending} record(s) remain under older keys: run 'flowvault rotate-key'",
        ],
    )
    return 0


def signing_key_command(path: str, public_path: str, hint: bytes, io: CommandIO) -> int:
    """Report where the new signing key and its public key were written."""
    io.emit(
        {"signing_key": path, "public_key": public_path, "key_hint": hint.hex()},
        [
            f"wrote signing key {path} (0600) and public key {public_path} (key hint {hint.hex()})",
            f"set FLOWVAULT_SIGNING_KEY_FILE={path} so head receipts and the "
            "terminal receipts of runs ended while it is set are signed; "
            f"give {public_path} to whoever checks them",
        ],
    )
    return 0


def keys_retire_command(key_id: str, entries: Sequence[KeyEntry], io: CommandIO) -> int:
    """Report a retired key and the keys left in the ring."""
    io.emit(
        {"retired": key_id, "keys": [_entry_document(entry) for entry in entries]},
        [f"retired key {key_id}: it is no longer in the ring and opens nothing"],
    )
    return 0


def _report_lines(report: RotationReport) -> list[str]:
    lines = [f"re-sealed {report.resealed} record(s) under key {report.primary_key_id}"]
    if report.changed_meanwhile:
        lines.append(f"{report.changed_meanwhile} record(s) were written meanwhile")
    lines.extend(
        f"  {key_id}: {count} record(s)" for key_id, count in sorted(report.by_key.items())
    )
    if report.compacted is False:
        lines.append("old seals may remain in the database files: run 'flowvault purge' later")
    if report.remaining:
        lines.append(f"{report.remaining} record(s) still under older keys: run it again")
    return lines


def rotate_key_command(rotation: KeyRotation, io: CommandIO) -> int:
    """Re-seal everything under older keys; exit 1 if any record is left behind."""
    with io.tracker(total=rotation.pending(), label="re-sealed") as update:
        report = rotation.run(progress=lambda done, _total: update(done))
    io.emit(
        {
            "primary_key_id": report.primary_key_id,
            "resealed": report.resealed,
            "changed_meanwhile": report.changed_meanwhile,
            "remaining": report.remaining,
            "by_key": dict(report.by_key),
            "compacted": report.compacted,
        },
        _report_lines(report),
    )
    return 0 if report.remaining == 0 else 1
