"""Terminal input and output for commands, injectable so tests need no terminal."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import TextIO

from flowvault.domain import FlowvaultError, canonical_json


@dataclass(slots=True)
class CommandIO:
    """Where a command writes, whether it may ask questions, and in which format."""

    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)
    stdin: TextIO = field(default_factory=lambda: sys.stdin)
    json_output: bool = False

    @property
    def interactive(self) -> bool:
        """True when a person can answer a prompt."""
        return self.stdin.isatty() and self.out.isatty()

    def confirm(self, question: str) -> bool:
        """Ask a yes/no question on stderr; anything but an explicit yes is no.

        The question goes to stderr so that stdout carries only the result
        (one JSON document with ``--json``).
        """
        self.err.write(f"{question} [y/N] ")
        self.err.flush()
        return self.stdin.readline().strip().lower() in {"y", "yes"}

    def emit(self, document: dict[str, object], lines: list[str]) -> None:
        """Print ``document`` as one JSON line, or ``lines`` for a person."""
        if self.json_output:
            self.out.write(canonical_json(document) + "\n")
        else:
            self.out.write("\n".join(lines) + "\n")

    def fail(self, error: FlowvaultError) -> int:
        """Report a flowvault error with its code and return the exit status 1."""
        if self.json_output:
            body = {"error": {"code": error.code, "message": error.message}}
            self.out.write(json.dumps(body, sort_keys=True) + "\n")
        else:
            self.err.write(f"error: {error.code}: {error.message}\n")
        return 1
