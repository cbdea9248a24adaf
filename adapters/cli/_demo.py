"""``flowvault demo``: the narration, a few readable lines per step, or one JSON document.

Only formatting lives here. The composition root runs the scripted scenario
on the services it built and hands each step's outcome to ``DemoNarrator``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from flowvault.adapters.cli._io import CommandIO
from flowvault.domain import JsonValue, ResetFingerprint

INDENT = "      "


class StepFailed(Exception):
    """A demo step did not behave as expected; the message says what was seen."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def expect(condition: bool, message: str) -> None:
    """Raise ``StepFailed`` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise StepFailed(message)


@dataclass(frozen=True, slots=True)
class StepReport:
    """What one step showed: lines for a person and a digest-only detail for ``--json``."""

    lines: tuple[str, ...]
    detail: Mapping[str, JsonValue] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DemoStep:
    """A step's stable name (used by ``--json`` and in failures) and its title."""

    name: str
    title: str


def short(identifier: str, keep: int = 12) -> str:
    """Return an id or digest shortened for a narration line."""
    head, _, tail = identifier.partition(":")
    if tail:
        return f"{head}:{tail[:keep]}..." if len(tail) > keep else identifier
    return f"{identifier[:keep]}..." if len(identifier) > keep else identifier


def fingerprint_lines(fingerprint: ResetFingerprint) -> list[str]:
    """Return the plaintext-free fingerprint as ``name: value`` lines."""
    shown = fingerprint.model_dump(mode="json", exclude_none=True)
    return [f"{name}: {value}" for name, value in shown.items()]


@dataclass(slots=True)
class DemoNarrator:
    """Prints the demo as it runs; with ``--json`` prints one document at the end."""

    io: CommandIO
    steps: tuple[DemoStep, ...]
    home: Path
    done: list[dict[str, JsonValue]] = field(default_factory=list)

    def start(self) -> None:
        """Say what runs and where, before the first step."""
        self.io.say(
            "flowvault demo: an approval workflow, end to end, on the embedded SQLite store"
        )
        self.io.say(f"home: {self.home}")
        self.io.say(
            f"      (a fresh directory for this demo; delete it when done: rm -r {self.home})"
        )

    def passed(self, step: DemoStep, report: StepReport) -> None:
        """Narrate a step that behaved as expected."""
        number = len(self.done) + 1
        self.io.say(f"[{number}/{len(self.steps)}] {step.title}")
        for line in report.lines:
            self.io.say(INDENT + line)
        self.done.append({"name": step.name, "ok": True, "detail": dict(report.detail)})

    def failed(self, step: DemoStep, message: str) -> int:
        """Report the step that did not behave as expected; return exit status 1."""
        number = len(self.done) + 1
        if self.io.json_output:
            failure: dict[str, JsonValue] = {"name": step.name, "ok": False, "error": message}
            self.io.emit(self._document(ok=False, steps=[*self.done, failure]), [])
        else:
            self.io.err.write(
                f"demo failed at step {number}/{len(self.steps)} ({step.name}: {step.title}): "
                f"{message}\n"
            )
            self.io.err.write(f"  the store is left in {self.home} for inspection\n")
        return 1

    def finished(self, fingerprint: ResetFingerprint) -> int:
        """Close the demo with its fingerprint; return exit status 0."""
        document = self._document(ok=True, steps=self.done)
        document["fingerprint"] = fingerprint.model_dump(mode="json")
        lines = [
            f"demo passed: all {len(self.done)} steps behaved as expected",
            f"fingerprint of the demo scope: {fingerprint.payload_digest or 'absent'}",
        ]
        self.io.emit(document, lines)
        return 0

    def _document(self, *, ok: bool, steps: list[dict[str, JsonValue]]) -> dict[str, JsonValue]:
        listed: list[JsonValue] = list(steps)
        return {"home": str(self.home), "ok": ok, "steps": listed}
