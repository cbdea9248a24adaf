"""A health check's verdict, shared by the backends that diagnose themselves and the CLI."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True, slots=True)
class Check:
    """One doctor check: what was found and, when it failed, the fix.

    A failed check of severity ``error`` makes ``doctor`` exit 1; a
    ``warning`` (a problem the settings explicitly allow) does not.
    """

    name: str
    ok: bool
    finding: str
    fix: str | None = None
    severity: Severity = "error"

    @property
    def is_error(self) -> bool:
        """Whether this check fails the doctor run."""
        return not self.ok and self.severity == "error"
