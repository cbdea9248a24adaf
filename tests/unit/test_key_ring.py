"""The key ring: its file format, its rules, and a cipher whose digests survive rotation."""

from __future__ import annotations

import base64
import os
import stat
import threading
from pathlib import Path

import pytest

from flowvault.adapters.crypto import AesGcmCipher, FileKeyStore
from flowvault.adapters.crypto._cipher import derive_integrity_key, key_id_of
from flowvault.adapters.memory import InMemoryKeyStore
from flowvault.application._keys import (
    MAX_RING_KEYS,
    RING_HEADER,
    KeyRing,
    KeyRingStore,
    encode_master_key,
    format_key_ring,
    parse_key_ring,
)
from flowvault.domain import InsecurePermissions, IntegrityFailure, InvalidInput, RevisionConflict

KEY_A = bytes(range(32))
KEY_B = bytes(range(32, 64))
KEY_C = bytes(range(64, 96))
AAD = b"row"


def _spellings(key: bytes) -> list[str]:
    """Every text form a key could leak in: URL-safe and standard base64, padded or not, hex."""
    forms = [base64.urlsafe_b64encode(key).decode(), base64.b64encode(key).decode(), key.hex()]
    return forms + [form.rstrip("=") for form in forms]


def _ring_of_two() -> KeyRing:
    return KeyRing(primary=KEY_A).promote(KEY_B, integrity=derive_integrity_key(KEY_A))


# --- the ring value -------------------------------------------------------------------------


def test_single_key_ring_keeps_the_one_line_file_format() -> None:
    """A single key is written as older builds wrote it, so they can still read it."""
    ring = KeyRing(primary=KEY_A)
    assert format_key_ring(ring) == encode_master_key(KEY_A) + "\n"
    assert parse_key_ring(format_key_ring(ring), "test") == ring


def test_ring_round_trips_through_its_text() -> None:
    """A ring of several keys keeps every key, its role and its integrity key."""
    ring = _ring_of_two().promote(KEY_C, integrity=derive_integrity_key(KEY_A))
    text = format_key_ring(ring)
    assert text.splitlines()[0] == RING_HEADER
    assert parse_key_ring(text, "test") == ring
    assert ring.keys == (KEY_C, KEY_B, KEY_A)


@pytest.mark.parametrize(
    "lines",
    [
        ["primary {a}"],
        ["integrity {a}", "integrity {b}", "primary {a}"],
        ["integrity {a}", "primary {a}", "primary {b}"],
        ["integrity {a}", "primary {a}", "spare {b}"],
        ["integrity {a}", "primary {a}", "open {a}"],
        ["integrity {a}", "primary {a}", "open not-a-key"],
        ["integrity short", "primary {a}"],
    ],
)
def test_malformed_rings_are_refused_without_echoing_keys(lines: list[str]) -> None:
    """A damaged key file is INVALID_INPUT, and the message never repeats key text."""
    text = "\n".join([RING_HEADER, *lines]).format(
        a=encode_master_key(KEY_A), b=encode_master_key(KEY_B)
    )
    with pytest.raises(InvalidInput) as caught:
        parse_key_ring(text, "key file")
    shown = str(caught.value) + repr(caught.value)
    for key in (KEY_A, KEY_B):
        assert not any(form in shown for form in _spellings(key))


def test_promote_and_without_keep_the_rules() -> None:
    """One primary; the primary cannot be retired; a key joins once; integrity never changes."""
    ring = _ring_of_two()
    assert (ring.primary, ring.previous) == (KEY_B, (KEY_A,))
    with pytest.raises(InvalidInput):
        ring.promote(KEY_A, integrity=derive_integrity_key(KEY_A))
    with pytest.raises(InvalidInput):
        ring.promote(KEY_C, integrity=derive_integrity_key(KEY_B))
    with pytest.raises(InvalidInput):
        ring.without(KEY_B)
    with pytest.raises(InvalidInput):
        ring.without(KEY_C)
    retired = ring.without(KEY_A)
    assert retired.keys == (KEY_B,)
    assert retired.integrity == ring.integrity
    with pytest.raises(InvalidInput):
        KeyRing(primary=KEY_A, previous=(KEY_B,))


def test_ring_repr_shows_no_key_material() -> None:
    """A ring in a log or traceback names counts, never keys."""
    ring = _ring_of_two()
    shown = repr(ring) + str(ring)
    for key in (KEY_A, KEY_B, derive_integrity_key(KEY_A)):
        assert not any(form in shown for form in _spellings(key))


# --- the cipher over a ring -----------------------------------------------------------------


def test_rotation_changes_no_keyed_digest() -> None:
    """Natural-key addresses and ledger digests stay valid after a new primary joins."""
    before = AesGcmCipher(KEY_A)
    after = AesGcmCipher.from_ring(_ring_of_two())
    assert after.keyed_digest(b"order-1") == before.keyed_digest(b"order-1")
    retired = AesGcmCipher.from_ring(_ring_of_two().without(KEY_A))
    assert retired.keyed_digest(b"order-1") == before.keyed_digest(b"order-1")


def test_ring_seals_under_the_new_primary_and_opens_the_old() -> None:
    """Old values open through the ring; new ones name the new key; a retired key opens none."""
    old = AesGcmCipher(KEY_A)
    sealed_before = old.seal(old.primary_key_id, b"before", AAD)
    ring = AesGcmCipher.from_ring(_ring_of_two())
    assert ring.primary_key_id == key_id_of(KEY_B)
    assert ring.open(sealed_before, AAD) == b"before"
    sealed_after = ring.seal(ring.primary_key_id, b"after", AAD)
    assert ring.sealed_key_id(sealed_after) == key_id_of(KEY_B)
    with pytest.raises(InvalidInput):
        ring.seal(key_id_of(KEY_A), b"x", AAD)
    retired = AesGcmCipher.from_ring(_ring_of_two().without(KEY_A))
    with pytest.raises(IntegrityFailure):
        retired.open(sealed_before, AAD)


# --- where the ring is kept -----------------------------------------------------------------


def test_file_key_store_rewrites_the_ring_atomically_and_privately(tmp_path: Path) -> None:
    """The rewritten key file is a complete 0600 file; the old one-line reader sees the primary."""
    keys = FileKeyStore(tmp_path / "keys")
    keys.create(KEY_A)
    ring = keys.read_ring()
    assert ring == KeyRing(primary=KEY_A)
    keys.replace_ring(_ring_of_two(), expected=ring)
    path = tmp_path / "keys" / "store.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert keys.read_ring() == _ring_of_two()
    assert keys.read() == KEY_B
    leftovers = sorted(p.name for p in path.parent.iterdir() if p.name.endswith(".tmp"))
    assert leftovers == []


def test_stale_ring_replacement_is_refused(tmp_path: Path) -> None:
    """Two operators adding keys at once: the second is told to re-read, nothing is lost."""
    keys = FileKeyStore(tmp_path / "keys")
    keys.create(KEY_A)
    first = KeyRing(primary=KEY_A)
    keys.replace_ring(_ring_of_two(), expected=first)
    with pytest.raises(RevisionConflict):
        keys.replace_ring(
            first.promote(KEY_C, integrity=derive_integrity_key(KEY_A)), expected=first
        )
    assert keys.read_ring() == _ring_of_two()


def test_concurrent_ring_replacements_have_one_winner(tmp_path: Path) -> None:
    """Eight threads replacing the same ring: exactly one wins, the file stays whole."""
    keys = FileKeyStore(tmp_path / "keys")
    keys.create(KEY_A)
    start = KeyRing(primary=KEY_A)
    candidates = [os.urandom(32) for _ in range(8)]
    barrier = threading.Barrier(len(candidates))
    outcomes: list[str] = []

    def replace(key: bytes) -> None:
        barrier.wait()
        try:
            keys.replace_ring(
                start.promote(key, integrity=derive_integrity_key(KEY_A)), expected=start
            )
            outcomes.append("won")
        except RevisionConflict:
            outcomes.append("conflict")

    threads = [threading.Thread(target=replace, args=(key,)) for key in candidates]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["conflict"] * 7 + ["won"]
    final = keys.read_ring()
    assert final is not None
    assert final.primary in candidates
    assert final.previous == (KEY_A,)


def test_symlinked_ring_file_is_still_refused(tmp_path: Path) -> None:
    """A ring is as secret as a key: a symlink in its place is refused, never followed."""
    keys_dir = tmp_path / "keys"
    keys_dir.mkdir(mode=0o700)
    target = tmp_path / "elsewhere.key"
    target.write_text(format_key_ring(_ring_of_two()))
    target.chmod(0o600)
    (keys_dir / "store.key").symlink_to(target)
    with pytest.raises(InsecurePermissions):
        FileKeyStore(keys_dir).read_ring()


def test_memory_key_store_holds_a_ring() -> None:
    """The memory backend's key store can be rotated too, for tests and demos."""
    keys = InMemoryKeyStore()
    assert isinstance(keys, KeyRingStore)
    keys.create(KEY_A)
    keys.replace_ring(_ring_of_two(), expected=KeyRing(primary=KEY_A))
    assert keys.read() == KEY_B
    with pytest.raises(RevisionConflict):
        keys.replace_ring(KeyRing(primary=KEY_C), expected=KeyRing(primary=KEY_A))


def test_a_ring_holds_at_most_a_hundred_keys() -> None:
    """An unbounded ring would be an unbounded key file; retiring unused keys makes room."""
    ring = KeyRing(primary=KEY_A)
    integrity = derive_integrity_key(KEY_A)
    for _ in range(MAX_RING_KEYS - 1):
        ring = ring.promote(os.urandom(32), integrity=integrity)
    assert len(ring.keys) == MAX_RING_KEYS
    with pytest.raises(InvalidInput):
        ring.promote(os.urandom(32), integrity=integrity)
    assert len(ring.without(KEY_A).promote(KEY_B, integrity=integrity).keys) == MAX_RING_KEYS
