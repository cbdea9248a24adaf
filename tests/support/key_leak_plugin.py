"""A pytest plugin that fails the session if any key shows up where people or logs look.

It watches the cipher derive keys (every master key and every 32-byte key
derived from one is registered) and receipt signers take Ed25519 keys, then
scans the captured stdout, stderr and log output of every test phase,
failure reports, and the message and repr of every flowvault error
constructed during the session. Keys made in child
processes are not seen; the tests that start them scan their output.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from key_scan import KEY_BYTES, KeyScanner
from log_capture import SESSION_LEVEL

from flowvault.adapters.crypto import Ed25519ReceiptSigner, _cipher
from flowvault.domain import FlowvaultError

SCANNER = KeyScanner()
_SHOWN = 20


def _watch_derivations() -> None:
    derive: Callable[[bytes, bytes, int], bytes] = _cipher._derive

    def registering(master_key: bytes, info: bytes, length: int) -> bytes:
        derived = derive(master_key, info, length)
        SCANNER.register(master_key, "a master key")
        if length == KEY_BYTES:
            SCANNER.register(derived, "a derived key")
        return derived

    _cipher._derive = registering


def _watch_signers() -> None:
    init = Ed25519ReceiptSigner.__init__

    def registering(self: Ed25519ReceiptSigner, private_key: Ed25519PrivateKey) -> None:
        init(self, private_key)
        SCANNER.register(private_key.private_bytes_raw(), "a receipt signing key")

    Ed25519ReceiptSigner.__init__ = registering  # type: ignore[method-assign]


def _watch_errors() -> None:
    init = FlowvaultError.__init__

    def scanning(self: FlowvaultError, message: str, **details: Any) -> None:
        init(self, message, **details)
        SCANNER.scan(f"{self}\n{self!r}", f"a {type(self).__name__}")

    FlowvaultError.__init__ = scanning  # type: ignore[method-assign]


def pytest_configure(config: pytest.Config) -> None:
    """Start watching before any test derives a key or raises an error.

    flowvault's logger is opened to debug, so every event it logs (each
    unit committed, key used, retry, verification) reaches pytest's log
    capture and is scanned with the rest of the phase's output.
    """
    logging.getLogger("flowvault").setLevel(SESSION_LEVEL)
    _watch_derivations()
    _watch_signers()
    _watch_errors()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Scan what the phase printed and logged, and its failure report."""
    for name, content in report.sections:
        SCANNER.scan(content, f"{report.nodeid} ({name})")
    if report.longrepr is not None:
        SCANNER.scan(report.longreprtext, f"{report.nodeid} (failure report)")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when any key was seen."""
    if SCANNER.findings and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say where keys were seen (their role and place, never the key)."""
    if not SCANNER.findings:
        return
    terminalreporter.section("key material seen", red=True)
    for finding in SCANNER.findings[:_SHOWN]:
        terminalreporter.line(finding)
    if len(SCANNER.findings) > _SHOWN:
        terminalreporter.line(f"... and {len(SCANNER.findings) - _SHOWN} more")
