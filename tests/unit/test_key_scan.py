"""The session-wide key scan finds keys in every usual spelling, and fails a leaking run."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from key_scan import KeyScanner

KEY = bytes(range(100, 132))
SUPPORT = Path(__file__).resolve().parents[1] / "support"
PYTEST = (sys.executable, "-m", "pytest", "-q", "-p", "key_leak_plugin", "-p", "no:cacheprovider")


def _scanner() -> KeyScanner:
    scanner = KeyScanner()
    scanner.register(KEY, "a master key")
    return scanner


def test_every_spelling_is_found_even_inside_longer_text() -> None:
    """URL-safe and standard base64, padded or not, and hex in either case, embedded or alone."""
    scanner = _scanner()
    spellings = [
        base64.urlsafe_b64encode(KEY).decode(),
        base64.urlsafe_b64encode(KEY).decode().rstrip("="),
        base64.b64encode(KEY).decode(),
        KEY.hex(),
        KEY.hex().upper(),
    ]
    for spelling in spellings:
        assert scanner.leaks(f"key={spelling}") == ["a master key"], spelling
        assert scanner.leaks(f"prefix{spelling}suffix") == ["a master key"], spelling


def test_other_keys_digests_and_short_keys_are_not_findings() -> None:
    """Only registered 32-byte keys count: digests, ids and other keys pass."""
    scanner = _scanner()
    scanner.register(b"short", "an id")
    other = os.urandom(32)
    text = " ".join(
        [
            base64.urlsafe_b64encode(other).decode(),
            other.hex(),
            "sha256:" + "ab" * 32,
            "k" + KEY[:6].hex(),
            base64.b64encode(b"short").decode(),
        ]
    )
    assert scanner.leaks(text) == []
    scanner.scan(text, "a test")
    assert scanner.findings == []


def test_a_leaking_session_fails(tmp_path: Path) -> None:
    """The plugin has teeth: a test that prints a key it just used fails the whole run."""
    leaking = tmp_path / "test_leak.py"
    leaking.write_text(
        textwrap.dedent(
            """
            import base64
            from flowvault.adapters.crypto import AesGcmCipher

            def test_prints_its_key():
                key = bytes(range(7, 39))
                AesGcmCipher(key)
                print("debug:", base64.b64encode(key).decode())
            """
        )
    )
    quiet = tmp_path / "test_quiet.py"
    quiet.write_text(
        "from flowvault.adapters.crypto import AesGcmCipher\n\n"
        "def test_uses_a_key():\n    AesGcmCipher(bytes(range(7, 39)))\n"
    )
    caught = _pytest_with_the_plugin(leaking)
    assert caught.returncode == 1, caught.stdout + caught.stderr
    assert "key material seen" in caught.stdout
    assert "a master key in" in caught.stdout
    assert "test_prints_its_key" in caught.stdout
    summary = caught.stdout.split("key material seen")[1]
    assert base64.b64encode(bytes(range(7, 39))).decode() not in summary
    clean = _pytest_with_the_plugin(quiet)
    assert clean.returncode == 0, clean.stdout + clean.stderr


def _pytest_with_the_plugin(test_file: Path) -> subprocess.CompletedProcess[str]:
    """Run one test file in a child pytest with only the key-leak plugin loaded."""
    return subprocess.run(
        [*PYTEST, str(test_file)],
        check=False,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(SUPPORT)},
        cwd=test_file.parent,
        timeout=120,
    )


def test_debug_events_are_scanned_too(tmp_path: Path) -> None:
    """Flowvault's debug events reach the scan: a key in one fails the run, as printed ones do."""
    leaking = tmp_path / "test_debug_leak.py"
    leaking.write_text(
        textwrap.dedent(
            """
            from flowvault.adapters.crypto import AesGcmCipher
            from flowvault.application._observability import EventLog

            def test_logs_its_key_at_debug():
                key = bytes(range(7, 39))
                AesGcmCipher(key)
                EventLog("flowvault.careless").debug("key_used", material=key.hex())
            """
        )
    )
    caught = _pytest_with_the_plugin(leaking)
    assert caught.returncode == 1, caught.stdout + caught.stderr
    assert "a master key in" in caught.stdout
    assert "test_logs_its_key_at_debug" in caught.stdout
