"""The ``flowvault`` verbs keys list, add and retire, and rotate-key: the key ring's life.

Adding a key makes it primary at once for every process that opens the
store afterwards; ``rotate-key`` then re-seals what older keys still hold,
and ``keys retire`` drops a key only once no record uses it. The ring lives
in the key file, so ``FLOWVAULT_KEY`` (a single key) cannot be rotated in
place.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from flowvault.adapters.cli._context import CliContext, Services
from flowvault.adapters.cli._io import CommandIO, fields_document
from flowvault.adapters.cli._keyed import existing_ring
from flowvault.adapters.crypto import create_signing_key
from flowvault.adapters.crypto._cipher import derive_integrity_key, generate_master_key, key_id_of
from flowvault.application._keys import KEY_ENV, KeyRing, KeyRingStore
from flowvault.application._rotation import MAX_BATCH, KeyRotation, RotationReport
from flowvault.domain import InvalidInput, KeyRequired, StoreUnavailable

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


def keys_list_command(entries: Sequence[KeyEntry], *, limit: int, io: CommandIO) -> int:
    """Print every key id with its role, records sealed under it and seals counted."""
    document = {"keys": [fields_document(entry) for entry in entries], "seal_limit": limit}
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
        {"retired": key_id, "keys": [fields_document(entry) for entry in entries]},
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
            "by_key": [
                {"key_id": key_id, "records": count}
                for key_id, count in sorted(report.by_key.items())
            ],
            "compacted": report.compacted,
        },
        _report_lines(report),
    )
    return 0 if report.remaining == 0 else 1


# -- gathering and arguments ----------------------------------------------------


def _ring_store(context: CliContext) -> KeyRingStore:
    """Return where the ring is kept, refusing configurations whose key cannot change."""
    settings = context.settings
    if settings.key is not None:
        if settings.backend == "postgres" and settings.key_file is None:
            move = (
                f"write the key to a private file (mode 0600), set FLOWVAULT_KEY_FILE to it "
                f"on every host, unset {KEY_ENV} and run this again"
            )
        else:
            move = (
                f"write the key to {settings.key_path} (mode 0600), unset {KEY_ENV} and run "
                "this again"
            )
        raise InvalidInput(
            f"{KEY_ENV} holds a single key, and rotation keeps a ring in a key file", fix=move
        )
    if settings.backend == "memory":
        raise InvalidInput(
            "the memory backend keeps no keys to rotate",
            fix="rotate keys on the SQLite or PostgreSQL store that holds the data",
        )
    return context.key_file()


def _current_ring(context: CliContext) -> KeyRing:
    """Return the ring opening uses: ``FLOWVAULT_KEY`` as a single key, else the key file."""
    ring = None if context.settings.backend == "memory" else existing_ring(context)
    if ring is None:
        raise KeyRequired(f"no key: {KEY_ENV} is unset and there is no key file")
    return ring


@contextmanager
def _opened(context: CliContext) -> Iterator[Services]:
    """Open the store, refusing a cold root: these verbs never create a store."""
    services = context.open_existing()
    if services is None:
        raise StoreUnavailable("no store here yet: run 'flowvault init' first")
    with services:
        yield services


def _entries(services: Services, ring: KeyRing) -> list[KeyEntry]:
    stats = services.capabilities.stats
    records = {} if stats is None else dict(stats.key_id_counts())
    budget = services.repository.budget
    return key_entries(
        key_id_of(ring.primary),
        [key_id_of(key) for key in ring.previous],
        records,
        budget.counts() if budget.persistent else None,
    )


def _keys_list(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    with _opened(context) as services:
        entries = _entries(services, _current_ring(context))
        return keys_list_command(entries, limit=services.repository.budget.limit, io=io)


def _keys_add(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    keys = _ring_store(context)
    with _opened(context) as services:
        ring = _current_ring(context)
        integrity = ring.integrity or derive_integrity_key(ring.primary)
        added = ring.promote(generate_master_key(), integrity=integrity)
        keys.replace_ring(added, expected=ring)
        return keys_add_command(_entries(services, added), io)


def _keys_retire(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    keys = _ring_store(context)
    with _opened(context) as services:
        ring = _current_ring(context)
        by_id = {key_id_of(key): key for key in ring.keys}
        if args.key_id not in by_id:
            raise InvalidInput(
                f"no key with id {args.key_id!r} in the ring",
                fix="pass a key id 'flowvault keys list' prints",
            )
        if by_id[args.key_id] == ring.primary:
            raise InvalidInput(
                "the primary key cannot be retired",
                fix="run 'flowvault keys add' and 'flowvault rotate-key' first, then retire it",
            )
        stats = services.capabilities.stats
        in_use = 0 if stats is None else stats.key_id_counts().get(args.key_id, 0)
        if in_use:
            raise InvalidInput(
                f"key {args.key_id} still seals {in_use} record(s): run 'flowvault rotate-key' "
                "until none remain, then retire it"
            )
        retired = ring.without(by_id[args.key_id])
        keys.replace_ring(retired, expected=ring)
        return keys_retire_command(args.key_id, _entries(services, retired), io)


def _rotate_key(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    with _opened(context) as services:
        return rotate_key_command(KeyRotation(services.repository, batch_size=args.batch_size), io)


def _signing_key(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    path: Path = args.out
    if str(path) == "-":
        raise InvalidInput("--out needs a file path: a signing key is never printed")
    signer = create_signing_key(
        path, allow_insecure_permissions=context.settings.allow_insecure_permissions
    )
    public_path = path.with_name(path.name + ".pub")
    return signing_key_command(str(path), str(public_path), signer.hint, io)


def _batch_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("must be a whole number") from None
    if not 1 <= value <= MAX_BATCH:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_BATCH}")
    return value
