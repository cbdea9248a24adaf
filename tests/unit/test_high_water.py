"""The high-water mark: its MAC'd text, the refusal of an older store, and its two-slot file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.system import SLOT_BYTES, MarkFileStore
from flowvault.application import (
    AntiRollback,
    CipherDigester,
    KeyRing,
    format_mark,
    parse_mark,
)
from flowvault.domain import InsecurePermissions, IntegrityFailure, StoreRolledBack

KEY = CipherDigester(AesGcmCipher.from_ring(KeyRing(primary=bytes(range(32)))))
OTHER = CipherDigester(AesGcmCipher.from_ring(KeyRing(primary=bytes(range(64, 96)))))


class Counter:
    """A ``StoreEpoch`` whose count a test sets."""

    def __init__(self, epoch: int = 0) -> None:
        self.value = epoch

    def epoch(self) -> int:
        """Return the count the test set."""
        return self.value


def _guard(path: Path, store: Counter, digester: CipherDigester = KEY) -> AntiRollback:
    return AntiRollback(store, MarkFileStore(path), digester)


def test_a_mark_round_trips_and_only_under_its_key() -> None:
    """The text names the epoch and a MAC; an edit or another key fails closed."""
    text = format_mark(42, KEY)
    assert text.startswith(b"flowvault high-water mark 1\nepoch 42\nmac sha256:")
    assert parse_mark(text, KEY, "here") == 42
    for forged in (
        text.replace(b"epoch 42", b"epoch 43"),
        text[:-2] + b"0\n",
        b"",
        b"\xff" * 10,
        text + b"extra\n",
        format_mark(42, OTHER),
    ):
        with pytest.raises(IntegrityFailure, match="does not verify under the store key"):
            parse_mark(forged, KEY, "here")


def test_an_older_store_is_refused_and_a_newer_one_moves_the_mark(tmp_path: Path) -> None:
    """Below the mark: STORE_ROLLED_BACK, naming both counts; at or above: the mark follows."""
    path = tmp_path / "keys" / "store.high-water"
    store = Counter(5)
    with capture_logs() as logs:
        assert _guard(path, store).check() == 0
    assert [entry["event"] for entry in logs] == ["high_water_mark_started"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    store.value = 9
    guard = _guard(path, store)
    assert guard.check() == 5
    assert parse_mark(MarkFileStore(path).read() or b"", KEY, "") == 9
    store.value = 7
    with pytest.raises(StoreRolledBack) as refused:
        _guard(path, store).check()
    assert refused.value.details == {"epoch": 7, "high_water": 9}
    assert "an older copy of the database was restored" in refused.value.message
    previous, current = _guard(path, store).accept()
    assert (previous, current) == (9, 7)
    assert _guard(path, store).check() == 7


def test_the_mark_never_goes_down_whoever_advances_it(tmp_path: Path) -> None:
    """Two processes share the file: the one that saw less cannot lower it."""
    path = tmp_path / "mark"
    ahead, behind = Counter(10), Counter(3)
    _guard(path, ahead).advance()
    _guard(path, behind).advance()
    assert parse_mark(MarkFileStore(path).read() or b"", KEY, "") == 10


def test_a_forged_mark_is_refused_on_open(tmp_path: Path) -> None:
    """A mark written without the key (or edited) fails the check until accepted."""
    path = tmp_path / "mark"
    MarkFileStore(path).update(lambda _: format_mark(1_000, OTHER))
    with pytest.raises(IntegrityFailure, match="does not verify"):
        _guard(path, Counter(4)).check()
    assert _guard(path, Counter(4)).accept() == (None, 4)
    assert _guard(path, Counter(4)).check() == 4


def test_a_torn_write_keeps_the_previous_mark(tmp_path: Path) -> None:
    """Each update writes the other slot; spoiling the newest leaves the one before."""
    path = tmp_path / "mark"
    marks = MarkFileStore(path)
    marks.update(lambda _: b"first")
    marks.update(lambda _: b"second")
    assert marks.read() == b"second"
    assert path.stat().st_size == 2 * SLOT_BYTES
    with open(path, "r+b") as file:
        file.seek(SLOT_BYTES + 20)
        file.write(b"\x00torn")
    assert marks.read() == b"first"
    marks.update(lambda current: (current or b"") + b"+third")
    assert marks.read() == b"first+third"
    with open(path, "r+b") as file:
        file.write(b"\xff" * (2 * SLOT_BYTES))
    assert marks.read() == b"", "a file with no intact slot reads as an unverifiable mark"
    assert MarkFileStore(tmp_path / "absent").read() is None


def test_an_exposed_or_symlinked_mark_is_refused(tmp_path: Path) -> None:
    """The mark gets the key file's protections: private, regular, never followed."""
    path = tmp_path / "mark"
    MarkFileStore(path).update(lambda _: b"x")
    os.chmod(path, 0o644)
    with pytest.raises(InsecurePermissions, match="chmod 600"):
        MarkFileStore(path).read()
    os.chmod(path, 0o600)
    link = tmp_path / "link"
    link.symlink_to(path)
    with pytest.raises(InsecurePermissions, match="symlink"):
        MarkFileStore(link).read()
    with pytest.raises(InsecurePermissions, match="symlink"):
        MarkFileStore(link).update(lambda _: b"y")
    assert MarkFileStore(path).read() == b"x"
