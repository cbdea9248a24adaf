"""The ``flowvault`` verbs keys list, add and retire, and rotate-key: the key ring's life.

Adding a key makes it primary at once for every process that opens the
store afterwards; ``rotate-key`` then re-seals what older keys still hold,
and ``keys retire`` drops a key only once no record uses it. The ring lives
in the key file, so ``FLOWVAULT_KEY`` (a single key) cannot be rotated in
place.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from flowvault.adapters.cli import (
    CommandIO,
    KeyEntry,
    key_entries,
    keys_add_command,
    keys_list_command,
    keys_retire_command,
    rotate_key_command,
    signing_key_command,
)
from flowvault.adapters.crypto import (
    create_signing_key,
    derive_integrity_key,
    generate_master_key,
    key_id_of,
)
from flowvault.application import (
    DEFAULT_BATCH,
    KEY_ENV,
    MAX_BATCH,
    KeyRing,
    KeyRingStore,
    KeyRotation,
)
from flowvault.composition._bootstrap import Runtime, open_existing
from flowvault.composition._cli_base import Verbs, add_verb, file_path
from flowvault.composition._cli_ledger import existing_ring
from flowvault.composition._container import NO_SHARED_KEY_FILE, key_file_store
from flowvault.composition._settings import Settings
from flowvault.domain import InvalidInput, KeyRequired, StoreUnavailable


def _ring_store(settings: Settings) -> KeyRingStore:
    """Return where the ring is kept, refusing configurations whose key cannot change."""
    if settings.key is not None:
        raise InvalidInput(
            f"{KEY_ENV} holds a single key, and rotation keeps a ring in the key file: write "
            f"the key to {settings.key_path} (mode 0600), unset {KEY_ENV} and run this again"
        )
    if settings.backend == "memory":
        raise InvalidInput("the memory backend keeps no keys to rotate")
    if settings.backend == "postgres" and settings.key_file is None:
        raise KeyRequired(NO_SHARED_KEY_FILE)
    return key_file_store(settings)


def _current_ring(settings: Settings) -> KeyRing:
    """Return the ring opening uses: ``FLOWVAULT_KEY`` as a single key, else the key file."""
    ring = None if settings.backend == "memory" else existing_ring(settings)
    if ring is None:
        raise KeyRequired(f"no key: {KEY_ENV} is unset and there is no key file")
    return ring


@contextmanager
def _opened(settings: Settings) -> Iterator[Runtime]:
    """Open the store, refusing a cold root: these verbs never create a store."""
    runtime = open_existing(settings)
    if runtime is None:
        raise StoreUnavailable("no store here yet: run 'flowvault init' first")
    with runtime:
        yield runtime


def _entries(runtime: Runtime, ring: KeyRing) -> list[KeyEntry]:
    stats = runtime.capabilities.stats
    records = {} if stats is None else dict(stats.key_id_counts())
    budget = runtime.repository.budget
    return key_entries(
        key_id_of(ring.primary),
        [key_id_of(key) for key in ring.previous],
        records,
        budget.counts() if budget.persistent else None,
    )


def _keys_list(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    with _opened(settings) as runtime:
        entries = _entries(runtime, _current_ring(settings))
        return keys_list_command(entries, limit=runtime.repository.budget.limit, io=io)


def _keys_add(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    keys = _ring_store(settings)
    with _opened(settings) as runtime:
        ring = _current_ring(settings)
        integrity = ring.integrity or derive_integrity_key(ring.primary)
        added = ring.promote(generate_master_key(), integrity=integrity)
        keys.replace_ring(added, expected=ring)
        return keys_add_command(_entries(runtime, added), io)


def _keys_retire(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    keys = _ring_store(settings)
    with _opened(settings) as runtime:
        ring = _current_ring(settings)
        by_id = {key_id_of(key): key for key in ring.keys}
        if args.key_id not in by_id:
            raise InvalidInput(f"no key with id {args.key_id!r} in the ring: see 'keys list'")
        if by_id[args.key_id] == ring.primary:
            raise InvalidInput("the primary key cannot be retired: add a new key first")
        stats = runtime.capabilities.stats
        in_use = 0 if stats is None else stats.key_id_counts().get(args.key_id, 0)
        if in_use:
            raise InvalidInput(
                f"key {args.key_id} still seals {in_use} record(s): run 'flowvault rotate-key' "
                "until none remain, then retire it"
            )
        retired = ring.without(by_id[args.key_id])
        keys.replace_ring(retired, expected=ring)
        return keys_retire_command(args.key_id, _entries(runtime, retired), io)


def _rotate_key(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    with _opened(settings) as runtime:
        return rotate_key_command(KeyRotation(runtime.repository, batch_size=args.batch_size), io)


def _signing_key(args: argparse.Namespace, settings: Settings, io: CommandIO) -> int:
    path: Path = args.out
    if str(path) == "-":
        raise InvalidInput("--out needs a file path: a signing key is never printed")
    signer = create_signing_key(
        path, allow_insecure_permissions=settings.allow_insecure_permissions
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


def register(verbs: Verbs) -> None:
    """Add this group's verbs to the parser."""
    group = verbs.add_parser(
        "keys",
        help="list, add and retire the keys of the key ring",
        description="Manage the key ring kept in the key file. Never prints key material.",
    )
    leaves = group.add_subparsers(dest="keys_verb", required=True, metavar="VERB")
    add_verb(
        leaves,
        "list",
        help="show each key id, its role, and the records and seals under it",
        description=(
            "Show every key id of the ring (primary first, then open-only keys), the records "
            "sealed under each, and the seals counted against its nonce budget. Key ids that "
            "records name but the ring lacks are listed as missing."
        ),
        handler=_keys_list,
    )
    add_verb(
        leaves,
        "add",
        help="generate a new key and make it the primary key",
        description=(
            "Generate a new key and make it primary: the key file is rewritten atomically, "
            "the previous keys stay to open what they sealed, and processes opening the "
            "store from now on seal under the new key (restart running ones). Then run "
            "'flowvault rotate-key'."
        ),
        handler=_keys_add,
    )
    retire = add_verb(
        leaves,
        "retire",
        help="remove an open-only key that no record uses any more",
        description=(
            "Remove an open-only key from the ring. Refused while any record is still "
            "sealed under it (the message names how many) and for the primary key."
        ),
        handler=_keys_retire,
    )
    retire.add_argument("key_id", metavar="KEY_ID", help="the key id, as 'keys list' shows it")
    signing = add_verb(
        leaves,
        "signing-key",
        help="create an Ed25519 key pair for signing ledger head receipts",
        description=(
            "Create a new Ed25519 signing key at FILE (0600, PEM) and its public key at "
            "FILE.pub. Neither is ever overwritten. Point FLOWVAULT_SIGNING_KEY_FILE at FILE "
            "so 'ledger head' signs receipts, and hand FILE.pub to whoever checks them with "
            "'ledger check-receipt'. Needs no store."
        ),
        handler=_signing_key,
    )
    signing.add_argument(
        "--out", type=file_path, required=True, metavar="FILE", help="where to write the key"
    )
    rotate = add_verb(
        verbs,
        "rotate-key",
        help="re-seal every record still under an older key with the primary key",
        description=(
            "Re-seal every record still sealed under an older key with the primary key, in "
            "batches that each commit as one unit guarded by the revisions read; a record "
            "changed meanwhile is re-read, never overwritten. Safe beside running writers "
            "and resumable: after a crash, run it again. Prints the records per key id "
            "after; exits 1 if any record was left under an older key."
        ),
        handler=_rotate_key,
    )
    rotate.add_argument(
        "--batch-size",
        type=_batch_size,
        default=DEFAULT_BATCH,
        help=f"records per unit of work (default {DEFAULT_BATCH}, at most {MAX_BATCH})",
    )
