"""Find key material in text: every key the session derives, in base64 and hex.

The test session registers each master key and each key derived from it as
the cipher derives them, and feeds this scanner everything a person or a
log could see: captured stdout, stderr and log output of every test, and
the message and repr of every flowvault error raised. Text is cut into
base64-like and hex-like runs, and every 32-byte-key-sized window of a run
is looked up in a set, so the cost does not grow with the number of keys.
"""

from __future__ import annotations

import base64
import re
import threading
from dataclasses import dataclass, field

KEY_BYTES = 32
_B64_RUN = re.compile(r"[A-Za-z0-9+/_-]{43,}")
_HEX_RUN = re.compile(r"[0-9A-Fa-f]{64,}")


def spellings(key: bytes) -> set[str]:
    """Every text form a key is likely to leak in; padding dropped, hex folded to lower case."""
    forms = {
        base64.urlsafe_b64encode(key).decode("ascii").rstrip("="),
        base64.b64encode(key).decode("ascii").rstrip("="),
        key.hex(),
    }
    return forms


@dataclass
class KeyScanner:
    """Remembers keys and reports where any of them shows up in text."""

    _forms: dict[str, str] = field(default_factory=dict)
    findings: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def register(self, key: bytes, what: str) -> None:
        """Remember ``key`` (only 32-byte keys: ids and nonces are shorter and public)."""
        if len(key) != KEY_BYTES:
            return
        with self._lock:
            for form in spellings(key):
                self._forms.setdefault(form, what)

    def leaks(self, text: str) -> list[str]:
        """Return the kinds of key found in ``text`` (a key's role, never the key)."""
        with self._lock:
            forms = dict(self._forms)
        found: list[str] = []
        for run in _B64_RUN.findall(text):
            found.extend(_windows(run, 43, forms))
        for run in _HEX_RUN.findall(text):
            found.extend(_windows(run.lower(), 64, forms))
        return found

    def scan(self, text: str, where: str) -> None:
        """Record a finding for every key in ``text``, naming ``where`` it was seen."""
        for what in self.leaks(text):
            with self._lock:
                self.findings.append(f"{what} in {where}")


def _windows(run: str, width: int, forms: dict[str, str]) -> list[str]:
    return [
        forms[run[start : start + width]]
        for start in range(len(run) - width + 1)
        if run[start : start + width] in forms
    ]
