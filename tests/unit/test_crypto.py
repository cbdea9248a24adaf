"""AES-GCM sealing under a key ring and the key file: tamper, rotation, permissions, races."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from hypothesis import given, settings
from hypothesis import strategies as st
from log_capture import capture_logs

from flowvault.adapters.crypto import AesGcmCipher, FileKeyStore
from flowvault.adapters.crypto._cipher import WIRE_VERSION, generate_master_key
from flowvault.application import Cipher, KeyStore
from flowvault.application._keys import encode_master_key
from flowvault.domain import InsecurePermissions, IntegrityFailure, InvalidInput

KEY_A = bytes(range(32))
KEY_B = bytes(range(32, 64))
AAD = b"ns|digest|1"
KEY_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _seal(cipher: AesGcmCipher, plaintext: bytes, aad: bytes = AAD) -> bytes:
    return cipher.seal(cipher.primary_key_id, plaintext, aad)


def _write_key_file(path: Path, text: str, mode: int = 0o600) -> None:
    path.parent.mkdir(mode=0o700, exist_ok=True)
    path.write_text(text, encoding="ascii")
    path.chmod(mode)


# --- cipher ---------------------------------------------------------------------------------


def test_cipher_satisfies_the_port() -> None:
    """The cipher is a structural ``Cipher``."""
    assert isinstance(AesGcmCipher(KEY_A), Cipher)


@pytest.mark.parametrize("plaintext", [b"", b"x", os.urandom(1 << 20)], ids=["empty", "1B", "1MiB"])
def test_seal_open_round_trip(plaintext: bytes) -> None:
    """What is sealed opens to the same bytes under the same associated data."""
    cipher = AesGcmCipher(KEY_A)
    assert cipher.open(_seal(cipher, plaintext), AAD) == plaintext


@settings(max_examples=50, deadline=None)
@given(plaintext=st.binary(max_size=512), aad=st.binary(max_size=64))
def test_round_trip_for_any_bytes(plaintext: bytes, aad: bytes) -> None:
    """Any plaintext and associated data round-trip."""
    cipher = AesGcmCipher(KEY_A)
    assert cipher.open(_seal(cipher, plaintext, aad), aad) == plaintext


def test_wire_header_names_version_and_key_id() -> None:
    """A sealed value starts with the version byte, the id length and the id."""
    cipher = AesGcmCipher(KEY_A)
    sealed = _seal(cipher, b"hello")
    key_id = cipher.primary_key_id.encode("ascii")
    assert sealed[0] == WIRE_VERSION == 0x01
    assert sealed[1] == len(key_id)
    assert sealed[2 : 2 + len(key_id)] == key_id
    assert len(sealed) == 2 + len(key_id) + 12 + len(b"hello") + 16


def test_wire_format_opens_with_independently_derived_key() -> None:
    """The documented derivation and AAD layout open a sealed value without the adapter."""
    sealed = _seal(AesGcmCipher(KEY_A), b"hello")
    header_end = 2 + sealed[1]
    nonce = sealed[header_end : header_end + 12]
    derived = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=None, info=b"flowvault/v1/encryption"
    ).derive(KEY_A)
    aad = sealed[:header_end] + AAD
    assert AESGCM(derived).decrypt(nonce, sealed[header_end + 12 :], aad) == b"hello"
    with pytest.raises(InvalidTag):
        AESGCM(KEY_A).decrypt(nonce, sealed[header_end + 12 :], aad)


def test_associated_data_mismatch_fails() -> None:
    """A value opened with other associated data fails integrity."""
    cipher = AesGcmCipher(KEY_A)
    sealed = _seal(cipher, b"payload")
    with pytest.raises(IntegrityFailure):
        cipher.open(sealed, AAD + b"x")
    with pytest.raises(IntegrityFailure):
        cipher.open(sealed, b"")


@pytest.mark.parametrize("mask", [0x01, 0x80, 0xFF])
def test_every_single_byte_flip_fails(mask: int) -> None:
    """Changing any one byte of header, nonce, ciphertext or tag fails integrity."""
    cipher = AesGcmCipher(KEY_A, previous_keys=[KEY_B])
    sealed = _seal(cipher, b"small secret")
    for position in range(len(sealed)):
        tampered = bytearray(sealed)
        tampered[position] ^= mask
        with pytest.raises(IntegrityFailure):
            cipher.open(bytes(tampered), AAD)


def test_every_truncation_fails() -> None:
    """Every proper prefix of a sealed value fails integrity, as does an extension."""
    cipher = AesGcmCipher(KEY_A)
    sealed = _seal(cipher, b"small secret")
    for length in range(len(sealed)):
        with pytest.raises(IntegrityFailure):
            cipher.open(sealed[:length], AAD)
    with pytest.raises(IntegrityFailure):
        cipher.open(sealed + b"\x00", AAD)


def test_value_sealed_under_another_key_fails() -> None:
    """A cipher without the sealing key refuses the value by id, with a stable code."""
    sealed = _seal(AesGcmCipher(KEY_A), b"payload")
    other = AesGcmCipher(KEY_B)
    with pytest.raises(IntegrityFailure) as caught:
        other.open(sealed, AAD)
    assert caught.value.code == "INTEGRITY_FAILURE"
    assert AesGcmCipher(KEY_A).primary_key_id in caught.value.message


def test_relabelled_key_id_fails_even_when_the_key_is_known() -> None:
    """Rewriting the header to name another ring key fails rather than trying it."""
    cipher = AesGcmCipher(KEY_A, previous_keys=[KEY_B])
    sealed = _seal(cipher, b"payload")
    old_id = cipher.primary_key_id.encode("ascii")
    new_id = AesGcmCipher(KEY_B).primary_key_id.encode("ascii")
    relabelled = sealed.replace(old_id, new_id, 1)
    assert cipher.sealed_key_id(relabelled) == new_id.decode("ascii")
    with pytest.raises(IntegrityFailure):
        cipher.open(relabelled, AAD)


def test_previous_keys_open_but_seals_use_the_primary() -> None:
    """After rotation old values still open and new seals name the new primary."""
    old = AesGcmCipher(KEY_A)
    sealed_before = _seal(old, b"before")
    rotated = AesGcmCipher(KEY_B, previous_keys=[KEY_A])
    assert rotated.open(sealed_before, AAD) == b"before"
    assert rotated.key_ids() == {old.primary_key_id, rotated.primary_key_id}
    sealed_after = _seal(rotated, b"after")
    assert rotated.sealed_key_id(sealed_after) == rotated.primary_key_id
    with pytest.raises(IntegrityFailure):
        old.open(sealed_after, AAD)


def test_sealing_under_a_previous_or_unknown_key_is_refused() -> None:
    """Only the primary key seals; other ids are invalid input."""
    rotated = AesGcmCipher(KEY_B, previous_keys=[KEY_A])
    with pytest.raises(InvalidInput):
        rotated.seal(AesGcmCipher(KEY_A).primary_key_id, b"x", AAD)
    with pytest.raises(InvalidInput):
        rotated.seal("k000000000000", b"x", AAD)


def test_sealed_key_id_reads_the_header_and_refuses_garbage() -> None:
    """The key id comes from the header; malformed values fail integrity."""
    cipher = AesGcmCipher(KEY_A)
    assert cipher.sealed_key_id(_seal(cipher, b"x")) == cipher.primary_key_id
    for garbage in [b"", b"\x01", b"\x02\x01k" + bytes(28), b"\x01\x01\xff" + bytes(28)]:
        with pytest.raises(IntegrityFailure):
            cipher.sealed_key_id(garbage)


def test_seals_of_the_same_plaintext_differ() -> None:
    """Each seal draws a fresh nonce, so equal plaintexts do not look equal."""
    cipher = AesGcmCipher(KEY_A)
    assert _seal(cipher, b"same") != _seal(cipher, b"same")


def test_key_ids_are_deterministic_and_distinct() -> None:
    """A key always has the same well-formed id, and different keys have different ids."""
    first, again, other = AesGcmCipher(KEY_A), AesGcmCipher(KEY_A), AesGcmCipher(KEY_B)
    assert first.primary_key_id == again.primary_key_id
    assert first.primary_key_id != other.primary_key_id
    assert KEY_ID.match(first.primary_key_id)
    assert re.fullmatch(r"k[0-9a-f]{12}", first.primary_key_id)


def test_duplicate_keys_collapse() -> None:
    """Listing a key twice, or the primary as a previous key, changes nothing."""
    cipher = AesGcmCipher(KEY_A, previous_keys=[KEY_A, KEY_B, KEY_B])
    assert len(cipher.key_ids()) == 2
    assert cipher.primary_key_id == AesGcmCipher(KEY_A).primary_key_id


def test_keyed_digest_uses_a_separate_integrity_key() -> None:
    """The digest is an HMAC under a derived key, not a plain hash nor an HMAC of the raw key."""
    cipher = AesGcmCipher(KEY_A)
    digest = cipher.keyed_digest(b"natural-key")
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest)
    assert digest == cipher.keyed_digest(b"natural-key")
    assert digest != "sha256:" + hashlib.sha256(b"natural-key").hexdigest()
    assert digest != "sha256:" + hmac.new(KEY_A, b"natural-key", hashlib.sha256).hexdigest()
    assert digest != AesGcmCipher(KEY_B).keyed_digest(b"natural-key")


@given(st.binary(max_size=300), st.binary(min_size=32, max_size=32))
def test_keyed_digest_is_plain_hmac_sha256(data: bytes, integrity: bytes) -> None:
    """The resumed pad states give exactly what ``hmac`` computes from the key."""
    cipher = AesGcmCipher(KEY_A, integrity_key=integrity)
    expected = hmac.new(integrity, data, hashlib.sha256).hexdigest()
    assert cipher.keyed_digest(data) == "sha256:" + expected
    assert cipher.keyed_digest(data) == "sha256:" + expected


def test_keyed_digest_follows_the_primary_key() -> None:
    """Digests are computed under the primary key, not a previous one."""
    rotated = AesGcmCipher(KEY_B, previous_keys=[KEY_A])
    assert rotated.keyed_digest(b"n") == AesGcmCipher(KEY_B).keyed_digest(b"n")


def test_repr_hides_key_material() -> None:
    """The repr names key ids and never the raw or encoded keys."""
    cipher = AesGcmCipher(KEY_A, previous_keys=[KEY_B])
    shown = repr(cipher) + repr(vars(cipher))
    assert cipher.primary_key_id in shown
    for key in (KEY_A, KEY_B):
        for form in (repr(key), key.hex(), base64.b64encode(key).decode(), encode_master_key(key)):
            assert form not in shown


@pytest.mark.parametrize("length", [0, 16, 31, 33, 64])
def test_wrong_length_keys_are_refused(length: int) -> None:
    """Master keys, primary or previous, must be exactly 32 bytes."""
    with pytest.raises(InvalidInput):
        AesGcmCipher(bytes(length))
    with pytest.raises(InvalidInput):
        AesGcmCipher(KEY_A, previous_keys=[bytes(length)])


def test_generated_keys_are_fresh_and_usable() -> None:
    """Generated master keys are 32 random bytes a cipher accepts."""
    first, second = generate_master_key(), generate_master_key()
    assert len(first) == 32
    assert first != second
    assert AesGcmCipher(first, previous_keys=[second]).key_ids()


# --- key file -------------------------------------------------------------------------------


def test_key_store_satisfies_the_port(tmp_path: Path) -> None:
    """The key file store is a structural ``KeyStore`` that names its path."""
    store = FileKeyStore(tmp_path / "keys")
    assert isinstance(store, KeyStore)
    assert store.location == str(tmp_path / "keys" / "store.key")


def test_missing_key_file_reads_as_none(tmp_path: Path) -> None:
    """No directory or no file means no key yet."""
    assert FileKeyStore(tmp_path / "keys").read() is None
    (tmp_path / "keys").mkdir(mode=0o700)
    assert FileKeyStore(tmp_path / "keys").read() is None


def test_create_then_read_returns_the_key(tmp_path: Path) -> None:
    """A created key reads back identically, as base64 text with a newline."""
    key = generate_master_key()
    store = FileKeyStore(tmp_path / "a" / "keys")
    assert store.create(key) == key
    assert store.read() == key
    assert Path(store.location).read_text(encoding="ascii") == encode_master_key(key) + "\n"


def test_created_file_and_directory_are_private(tmp_path: Path) -> None:
    """The key file is 0600 and a new keys directory is 0700, whatever the umask."""
    previous = os.umask(0o022)
    try:
        store = FileKeyStore(tmp_path / "keys")
        store.create(generate_master_key())
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.stat(store.location).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "keys").st_mode) == 0o700
    assert os.listdir(tmp_path / "keys") == ["store.key"]


def test_create_keeps_an_existing_key(tmp_path: Path) -> None:
    """Creating over an existing key file returns the existing key, untouched."""
    store = FileKeyStore(tmp_path / "keys")
    existing = store.create(generate_master_key())
    assert store.create(generate_master_key()) == existing
    assert store.read() == existing
    assert os.listdir(tmp_path / "keys") == ["store.key"]


@pytest.mark.parametrize("mode", [0o400, 0o600, 0o700])
def test_owner_only_key_file_is_accepted(tmp_path: Path, mode: int) -> None:
    """Any mode that grants nothing to group or others is accepted."""
    _write_key_file(tmp_path / "keys" / "store.key", encode_master_key(KEY_A) + "\n", mode)
    assert FileKeyStore(tmp_path / "keys").read() == KEY_A


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644, 0o610])
def test_exposed_key_file_is_refused(tmp_path: Path, mode: int) -> None:
    """A key file open to group or others is refused with the chmod that fixes it."""
    path = tmp_path / "keys" / "store.key"
    _write_key_file(path, encode_master_key(KEY_A) + "\n", mode)
    with pytest.raises(InsecurePermissions) as caught:
        FileKeyStore(tmp_path / "keys").read()
    assert f"chmod 600 {path}" in caught.value.message
    assert encode_master_key(KEY_A) not in str(caught.value)


def test_symlinked_key_file_is_refused(tmp_path: Path) -> None:
    """A symlink is refused even when it points at a well-protected key file."""
    real = tmp_path / "keys" / "real.key"
    _write_key_file(real, encode_master_key(KEY_A) + "\n")
    (tmp_path / "keys" / "store.key").symlink_to(real)
    with pytest.raises(InsecurePermissions) as caught:
        FileKeyStore(tmp_path / "keys").read()
    assert "replace the symlink with the real file" in caught.value.message


def test_symlink_is_refused_even_when_insecure_permissions_are_allowed(tmp_path: Path) -> None:
    """The opt-out covers modes, never symlinks."""
    real = tmp_path / "keys" / "real.key"
    _write_key_file(real, encode_master_key(KEY_A) + "\n")
    (tmp_path / "keys" / "store.key").symlink_to(real)
    with pytest.raises(InsecurePermissions):
        FileKeyStore(tmp_path / "keys", allow_insecure_permissions=True).read()


def test_directory_in_place_of_the_key_file_is_refused(tmp_path: Path) -> None:
    """Something other than a regular file at the key path is refused."""
    (tmp_path / "keys" / "store.key").mkdir(mode=0o700, parents=True)
    with pytest.raises(InsecurePermissions):
        FileKeyStore(tmp_path / "keys").read()


@pytest.mark.parametrize("mode", [0o770, 0o702, 0o777])
def test_writable_keys_directory_is_refused(tmp_path: Path, mode: int) -> None:
    """A keys directory others can write to is refused, on read and on create."""
    store = FileKeyStore(tmp_path / "keys")
    store.create(KEY_A)
    (tmp_path / "keys").chmod(mode)
    with pytest.raises(InsecurePermissions) as caught:
        store.read()
    assert f"chmod 700 {tmp_path / 'keys'}" in caught.value.message
    with pytest.raises(InsecurePermissions):
        FileKeyStore(tmp_path / "keys", file_name="other.key").create(KEY_B)


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")
def test_key_file_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    """A key file another user owns is refused with the chown that fixes it."""
    path = tmp_path / "keys" / "store.key"
    _write_key_file(path, encode_master_key(KEY_A) + "\n")
    os.chown(path, 65534, -1)
    with pytest.raises(InsecurePermissions) as caught:
        FileKeyStore(tmp_path / "keys").read()
    assert "chown" in caught.value.message


def test_allowing_insecure_permissions_logs_a_warning(tmp_path: Path) -> None:
    """With the opt-out, exposed modes are read and reported as warnings with their fix."""
    path = tmp_path / "keys" / "store.key"
    _write_key_file(path, encode_master_key(KEY_A) + "\n", 0o644)
    (tmp_path / "keys").chmod(0o770)
    with capture_logs() as logs:
        assert FileKeyStore(tmp_path / "keys", allow_insecure_permissions=True).read() == KEY_A
    warnings = [entry for entry in logs if entry["log_level"] == "warning"]
    fixes = {entry["fix"] for entry in warnings}
    assert f"run `chmod 600 {path}`" in fixes
    assert f"run `chmod 700 {tmp_path / 'keys'}`" in fixes
    assert all(encode_master_key(KEY_A) not in str(entry) for entry in logs)


@pytest.mark.parametrize(
    "content",
    ["not-a-key-but-secret-ish\n", encode_master_key(KEY_A)[:-3] + "\n", "", "A" * 10_000],
)
def test_malformed_key_file_is_invalid_input(tmp_path: Path, content: str) -> None:
    """Malformed content is invalid input, and the message does not repeat it."""
    _write_key_file(tmp_path / "keys" / "store.key", content)
    with pytest.raises(InvalidInput) as caught:
        FileKeyStore(tmp_path / "keys").read()
    assert "store.key" in caught.value.message
    if content.strip():
        assert content.strip()[:20] not in str(caught.value)


@pytest.mark.parametrize("name", ["", ".", "..", "a/b"])
def test_key_file_name_must_be_one_component(tmp_path: Path, name: str) -> None:
    """The key file name cannot escape the keys directory."""
    with pytest.raises(InvalidInput):
        FileKeyStore(tmp_path, file_name=name)


def test_create_refuses_a_wrong_length_key(tmp_path: Path) -> None:
    """Only a 32-byte key is written, and nothing is left behind when refused."""
    with pytest.raises(InvalidInput):
        FileKeyStore(tmp_path / "keys").create(bytes(16))
    assert not (tmp_path / "keys").exists()


# --- concurrent first start -----------------------------------------------------------------

_RACER = """
import sys, time
from pathlib import Path
from flowvault.adapters.crypto import FileKeyStore
from flowvault.adapters.crypto._cipher import generate_master_key
from flowvault.application._keys import encode_master_key
go, keys, ready = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
ready.touch()
while not go.exists():
    time.sleep(0.0005)
print(encode_master_key(FileKeyStore(keys).create(generate_master_key())))
"""
_RACERS = 8


def _race(root: Path) -> tuple[Path, list[str]]:
    keys = root / "fresh" / "keys"
    go, signals = root / "go", root / "signals"
    signals.mkdir(parents=True)
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, str(go), str(keys), str(signals / str(number))],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for number in range(_RACERS)
    ]
    deadline = time.monotonic() + 60
    while len(os.listdir(signals)) < _RACERS and time.monotonic() < deadline:
        time.sleep(0.005)
    go.touch()
    results = []
    for racer in racers:
        out, err = racer.communicate(timeout=60)
        assert racer.returncode == 0, err
        results.append(out.strip())
    return keys, results


@pytest.mark.parametrize("round_number", range(5))
def test_concurrent_creates_agree_on_one_key(tmp_path: Path, round_number: int) -> None:
    """Eight processes creating at once all return the one key that reached the file."""
    keys, results = _race(tmp_path / f"round{round_number}")
    on_disk = (keys / "store.key").read_text(encoding="ascii").strip()
    assert set(results) == {on_disk}
    assert os.listdir(keys) == ["store.key"]
    assert stat.S_IMODE(os.stat(keys).st_mode) == 0o700
