"""Where the store key comes from, and the rule that a key is never invented over data."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable

from flowvault.domain import IntegrityFailure, InvalidInput, KeyRequired

MASTER_KEY_BYTES = 32
KEY_ENV = "FLOWVAULT_KEY"
_KEY_TEXT = re.compile(r"^[A-Za-z0-9_-]{43}=?$")


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
        )
