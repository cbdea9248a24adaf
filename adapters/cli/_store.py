"""``flowvault init``, ``status`` and ``doctor``: report a store's creation, state and health.

The composition root gathers the facts (it owns the settings and the paths);
these functions only format them and choose the exit status, so the same
facts print the same way on every backend and tests can feed them directly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from flowvault.adapters.cli._io import CommandIO

Severity = Literal["error", "warning"]


@dataclass(frozen=True, slots=True)
class InitReport:
    """What ``init`` created; never the key itself, only where it lives and its id."""

    backend: str
    home: str
    location: str
    key_file: str | None
    key_created: bool
    key_id: str


def _init_key_line(report: InitReport) -> str:
    if report.key_file is None:
        return "key: from FLOWVAULT_KEY (no key file is written)"
    verdict = "created" if report.key_created else "existing file kept"
    return f"key file: {report.key_file} ({verdict})"


def init_command(report: InitReport, io: CommandIO) -> int:
    """Print what ``init`` created; return exit status 0."""
    document = {
        "backend": report.backend,
        "home": report.home,
        "location": report.location,
        "key_file": report.key_file,
        "key_created": report.key_created,
        "key_id": report.key_id,
    }
    lines = [
        f"initialised a {report.backend} store",
        f"  home: {report.home}",
        f"  store: {report.location}",
        f"  {_init_key_line(report)}",
        f"  key id: {report.key_id}",
        "back up the key apart from the data: without it the data cannot be read",
    ]
    io.emit(document, lines)
    return 0


@dataclass(frozen=True, slots=True)
class StoreStatus:
    """A store's shape, read without opening any sealed payload.

    ``files`` maps each file of the store to its size in bytes, ``None``
    when absent; ``schema_version`` is what the store records, next to the
    ``supported_schema_version`` this build writes.
    """

    backend: str
    home: str
    location: str
    cold_root: bool = False
    schema_version: int | None = None
    supported_schema_version: int | None = None
    key_ids: Mapping[str, int] = field(default_factory=dict)
    namespaces: Mapping[str, int] = field(default_factory=dict)
    files: Mapping[str, int | None] = field(default_factory=dict)
    durability: Mapping[str, str] = field(default_factory=dict)


def _status_document(status: StoreStatus) -> dict[str, object]:
    return {
        "backend": status.backend,
        "home": status.home,
        "location": status.location,
        "cold_root": status.cold_root,
        "schema_version": status.schema_version,
        "supported_schema_version": status.supported_schema_version,
        "key_ids": dict(status.key_ids),
        "namespaces": dict(status.namespaces),
        "files": dict(status.files),
        "durability": dict(status.durability),
    }


def _status_lines(status: StoreStatus) -> list[str]:
    lines = [f"backend: {status.backend}", f"home: {status.home}", f"store: {status.location}"]
    if status.cold_root:
        return [*lines, "cold root: no store exists here; nothing was created"]
    lines.append(
        f"schema version: {status.schema_version} "
        f"(this flowvault writes {status.supported_schema_version})"
    )
    lines += [f"{name}: {value}" for name, value in status.durability.items()]
    return lines


def _size(size: int | None) -> str:
    return "absent" if size is None else f"{size} bytes"


def _counts(io: CommandIO, title: str, column: str, counts: Mapping[str, int]) -> None:
    if counts:
        io.table(title, [column, "records"], sorted(counts.items()))
    else:
        io.say(f"{title}: none")


def status_command(status: StoreStatus, io: CommandIO) -> int:
    """Print the store's status (or that the root is cold); return exit status 0."""
    io.emit(_status_document(status), _status_lines(status))
    if status.cold_root:
        return 0
    _counts(io, "key ids in use", "key id", status.key_ids)
    _counts(io, "namespaces", "namespace", status.namespaces)
    if status.files:
        rows = [(path, _size(size)) for path, size in status.files.items()]
        io.table("files", ["file", "size"], rows)
    return 0


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


def _check_lines(check: Check) -> list[str]:
    verdict = "ok" if check.ok else check.severity
    lines = [f"{verdict:7} {check.name}: {check.finding}"]
    if check.fix and not check.ok:
        lines.append(f"        fix: {check.fix}")
    return lines


def doctor_command(checks: Sequence[Check], io: CommandIO) -> int:
    """Print every check; return 1 when any failed check is an error, else 0."""
    errors = sum(check.is_error for check in checks)
    document = {
        "ok": errors == 0,
        "checks": [
            {
                "name": check.name,
                "ok": check.ok,
                "severity": check.severity,
                "finding": check.finding,
                "fix": check.fix,
            }
            for check in checks
        ],
    }
    lines = [line for check in checks for line in _check_lines(check)]
    lines.append("healthy" if errors == 0 else f"{errors} error(s) found")
    io.emit(document, lines)
    return 0 if errors == 0 else 1


# -- accept-restore -----------------------------------------------------------


def accept_restore_command(accepted: tuple[int | None, int, str] | None, io: CommandIO) -> int:
    """Report the high-water mark reset after a deliberate restore; ``None`` on a cold root."""
    if accepted is None:
        io.emit({"cold_root": True}, ["cold root: no store exists, nothing to accept"])
        return 0
    previous, current, location = accepted
    document = {"cold_root": False, "previous": previous, "epoch": current, "mark": location}
    shown = "none" if previous is None else f"commit {previous}"
    io.emit(
        document,
        [
            f"accepted the store as it is: high-water mark {location} now at commit "
            f"{current} (it was {shown})",
            "commits made after the restored copy was taken are not in this store",
        ],
    )
    return 0
