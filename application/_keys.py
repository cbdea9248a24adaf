"""Where the store keys come from, and the rule that a key is never invented over data.

A store is sealed under a key ring: one primary master key that seals, older
keys that only open, and the integrity key that keys natural-key digests and
ledger digests. The integrity key is kept apart from the encryption keys so
that rotating them neither re-addresses any record nor rewrites any digest;
a single master key (``FLOWVAULT_KEY`` or a one-line key file) is the ring
whose integrity key is derived from it.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from flowvault.domain import IntegrityFailure, InvalidInput, KeyRequired

MASTER_KEY_BYTES = 32
KEY_ENV = "FLOWVAULT_KEY"
_KEY_TEXT = re.compile(r"^[A-Za-z0-9_-]{43}=?$")
MAX_RING_KEYS = 100
"""Keys one ring may hold; retire keys no record uses before adding more."""
RING_HEADER = "flowvault key ring 1"
"""First line of a key file that holds a ring rather than a single key."""


@runtime_checkable
class KeyStore(Protocol):
    """The durable home of a store's master key (a key file, a secrets manager)."""

    @property
    def location(self) -> str:
        """Where the key is kept, for messages that tell an operator where to look."""
        ...

    def read(self) -> bytes | None:
        """Return the stored key, or ``None`` when none exists yet.

        Raises:
            InsecurePermissions: the key is exposed to other users.
            InvalidInput: the stored key is malformed.

        """
        ...

    def create(self, key: bytes) -> bytes:
        """Store ``key`` atomically unless one appeared first; return the key that won."""
        ...


@dataclass(frozen=True, slots=True)
class KeyRing:
    """The keys of one store: ``primary`` seals; ``previous`` only open; ``integrity`` digests.

    ``integrity`` is ``None`` for a ring made from a single master key, whose
    integrity key the cipher derives from it; once a second key joins, the
    derived integrity key is written out explicitly, so the first key can
    later be retired without changing any digest.
    """

    primary: bytes
    previous: tuple[bytes, ...] = ()
    integrity: bytes | None = None

    def __post_init__(self) -> None:
        for key in (self.primary, *self.previous):
            if not isinstance(key, bytes) or len(key) != MASTER_KEY_BYTES:
                raise InvalidInput(f"a master key must be exactly {MASTER_KEY_BYTES} bytes")
        if len({self.primary, *self.previous}) != 1 + len(self.previous):
            raise InvalidInput("a key ring holds each key once")
        if self.integrity is not None and (
            not isinstance(self.integrity, bytes) or len(self.integrity) != MASTER_KEY_BYTES
        ):
            raise InvalidInput(f"an integrity key must be exactly {MASTER_KEY_BYTES} bytes")
        if len(self.previous) >= MAX_RING_KEYS:
            raise InvalidInput(
                f"a key ring holds at most {MAX_RING_KEYS} keys: retire keys no record uses"
            )
        if self.integrity is None and self.previous:
            raise InvalidInput("a ring of several keys names its integrity key")

    @property
    def keys(self) -> tuple[bytes, ...]:
        """Every master key, primary first."""
        return (self.primary, *self.previous)

    def promote(self, key: bytes, *, integrity: bytes) -> KeyRing:
        """Return this ring with ``key`` as the new primary and the old primary open-only.

        ``integrity`` is this ring's integrity key (the caller derives it for
        a single-key ring), so digests stay as they were.
        """
        if key in self.keys:
            raise InvalidInput("that key is already in the ring")
        if self.integrity is not None and integrity != self.integrity:
            raise InvalidInput("a new primary key cannot change the ring's integrity key")
        return KeyRing(primary=key, previous=self.keys, integrity=integrity)

    def without(self, key: bytes) -> KeyRing:
        """Return this ring without the open-only ``key``; the primary cannot be removed."""
        if key == self.primary:
            raise InvalidInput("the primary key cannot be retired; add a new primary first")
        if key not in self.previous:
            raise InvalidInput("that key is not in the ring")
        previous = tuple(other for other in self.previous if other != key)
        return KeyRing(primary=self.primary, previous=previous, integrity=self.integrity)

    def __repr__(self) -> str:
        integrity = "derived" if self.integrity is None else "separate"
        return f"KeyRing(keys={len(self.keys)}, integrity={integrity})"


def format_key_ring(ring: KeyRing) -> str:
    """Return the key file text for ``ring``: a bare key line for a single-key ring.

    A single key keeps the one-line form older builds read; a ring is a
    header line and one ``role key`` line per key, in the same base64.
    """
    if ring.integrity is None:
        return encode_master_key(ring.primary) + "\n"
    lines = [RING_HEADER, f"integrity {encode_master_key(ring.integrity)}"]
    lines.append(f"primary {encode_master_key(ring.primary)}")
    lines.extend(f"open {encode_master_key(key)}" for key in ring.previous)
    return "\n".join(lines) + "\n"


def parse_key_ring(text: str | bytes, source: str) -> KeyRing:
    """Read a key file's text: one bare key, or a ring; messages never repeat key text."""
    if isinstance(text, bytes | bytearray):
        text = bytes(text).decode("ascii", "replace")
    if not isinstance(text, str):
        raise InvalidInput(f"{source} must be text")
    lines = [line.strip() for line in text.strip().splitlines()]
    if not lines or lines[0] != RING_HEADER:
        return KeyRing(primary=parse_master_key(text, source))
    roles: dict[str, list[bytes]] = {"integrity": [], "primary": [], "open": []}
    for number, line in enumerate(lines[1:], start=2):
        role, _, value = line.partition(" ")
        if role not in roles:
            raise InvalidInput(f"{source} line {number}: expected integrity, primary or open")
        roles[role].append(parse_master_key(value, f"{source} line {number}"))
    if len(roles["integrity"]) != 1 or len(roles["primary"]) != 1:
        raise InvalidInput(f"{source} must name exactly one integrity key and one primary key")
    return KeyRing(
        primary=roles["primary"][0],
        previous=tuple(roles["open"]),
        integrity=roles["integrity"][0],
    )


@runtime_checkable
class KeyRingStore(Protocol):
    """Optional capability of a ``KeyStore`` that can hold several keys and be rewritten."""

    def read_ring(self) -> KeyRing | None:
        """Return the stored ring, or ``None`` when there is no key yet."""
        ...

    def replace_ring(self, ring: KeyRing, *, expected: KeyRing) -> None:
        """Replace the stored ring with ``ring`` atomically, if it is still ``expected``.

        Raises:
            RevisionConflict: the stored ring changed since ``expected`` was read.

        """
        ...


def encode_master_key(key: bytes) -> str:
    """Return the URL-safe base64 text form used by ``FLOWVAULT_KEY`` and key files."""
    return base64.urlsafe_b64encode(key).decode("ascii")


def parse_master_key(text: str | bytes, source: str) -> bytes:
    """Decode URL-safe base64 of exactly 32 bytes; ``source`` names where it came from.

    The message never repeats the text: a near-miss key is still a secret.
    """
    if not isinstance(source, str):
        raise InvalidInput("the source of a key must be named as text")
    if isinstance(text, bytes | bytearray):
        raw = bytes(text).decode("ascii", "replace")
    elif isinstance(text, str):
        raw = text
    else:
        raise InvalidInput(f"{source} must be text")
    raw = raw.strip()
    if not _KEY_TEXT.fullmatch(raw):
        raise InvalidInput(f"{source} must be URL-safe base64 of {MASTER_KEY_BYTES} bytes")
    key = base64.urlsafe_b64decode(raw.rstrip("=") + "=")
    if encode_master_key(key) != raw.rstrip("=") + "=":
        raise InvalidInput(f"{source} is not a canonical base64 encoding of a key")
    return key


def resolve_key_ring(
    *,
    explicit: bytes | str | None,
    environ: Mapping[str, str],
    key_store: KeyStore,
    store_has_data: bool,
    new_key: Callable[[], bytes],
) -> KeyRing:
    """Pick the key ring: explicit, then ``FLOWVAULT_KEY``, then the key store's ring.

    Explicit and environment keys are single-key rings; only a key store
    that can hold a ring (``KeyRingStore``) yields older keys too.
    """
    if explicit is None and KEY_ENV not in environ and isinstance(key_store, KeyRingStore):
        stored = key_store.read_ring()
        if stored is not None:
            return stored
    return KeyRing(
        primary=resolve_master_key(
            explicit=explicit,
            environ=environ,
            key_store=key_store,
            store_has_data=store_has_data,
            new_key=new_key,
        )
    )


def resolve_master_key(
    *,
    explicit: bytes | str | None,
    environ: Mapping[str, str],
    key_store: KeyStore,
    store_has_data: bool,
    new_key: Callable[[], bytes],
) -> bytes:
    """Pick the master key: explicit, then ``FLOWVAULT_KEY``, then the key store.

    A new key is created only for a store that holds no sealed data; over
    existing data a missing key is ``KeyRequired``, never a fresh key that
    would make the data unreadable.
    """
    if isinstance(explicit, bytes) and len(explicit) == MASTER_KEY_BYTES:
        return explicit
    if explicit is not None:
        return parse_master_key(explicit, "the explicit key")
    if KEY_ENV in environ:
        return parse_master_key(environ[KEY_ENV], KEY_ENV)
    stored = key_store.read()
    if stored is not None:
        return stored
    if store_has_data:
        raise KeyRequired(
            "the store holds sealed data but no key was found: pass the key explicitly, "
            f"set {KEY_ENV}, or restore the key file at {key_store.location}"
        )
    return key_store.create(new_key())


WRONG_KEY_FIX = (
    "use the key this store was sealed with: check FLOWVAULT_KEY or the key file (the data "
    "is not damaged, so do not reset or delete anything)"
)
"""The remedy for a key that opens none of a store's records: a key question, not tampering."""


def check_key_matches(key_id_counts: Mapping[str, int], key_ids: frozenset[str]) -> None:
    """Refuse a key under which none of a non-empty store's records were sealed.

    Failing at open, rather than on the first read, keeps a wrong key from
    ever being used to write alongside data it cannot read.
    """
    in_use = {key_id for key_id, count in key_id_counts.items() if count > 0}
    if in_use and not in_use & key_ids:
        raise IntegrityFailure(
            "the key does not match this store: its records are sealed under key id(s) "
            + ", ".join(sorted(in_use))
            + "; the key given has id(s) "
            + ", ".join(sorted(key_ids)),
            fix=WRONG_KEY_FIX,
        )
