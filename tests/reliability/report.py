"""Print the figures recorded by a reliability run as a markdown table.

Usage: ``python tests/reliability/report.py FIGURES.jsonl``; exits non-zero
when the file is missing or any harness shows an anomaly or an uncaught
negative control. A run split into parts (``RELIABILITY_SPLIT``) prints a
row per part, then each family's sum over its parts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _control(value: object) -> str:
    return {True: "yes", False: "NO", None: "n/a"}[value]  # type: ignore[index]


def main(argv: list[str]) -> int:
    """Print the table; return 1 if any figure is bad."""
    if len(argv) != 1 or not Path(argv[0]).is_file():
        print("usage: report.py FIGURES.jsonl (the file must exist)", file=sys.stderr)
        return 2
    rows = [json.loads(line) for line in Path(argv[0]).read_text().splitlines() if line]
    if not rows:
        print(f"{argv[0]} holds no figures: no harness ran", file=sys.stderr)
        return 1
    print("| family | trials | anomalies | negative control caught | seconds | detail |")
    print("|---|---:|---:|---|---:|---|")
    bad = False
    for row in rows:
        bad |= row["anomalies"] != 0 or row["control_caught"] is False
        family = row["family"]
        if row.get("split", "1/1") != "1/1":
            family = f"{family} (part {row['split']})"
        print(
            f"| {family} | {row['trials']:,} | {row['anomalies']:,} "
            f"| {_control(row['control_caught'])} | {row['seconds']:.1f} | {row['detail']} |"
        )
    if any(row.get("split", "1/1") != "1/1" for row in rows):
        _print_sums(rows)
    return 1 if bad else 0


def _print_sums(rows: list[dict[str, Any]]) -> None:
    """Print each family's trials, anomalies and seconds added up over its rows and parts."""
    sums: dict[str, dict[str, Any]] = {}
    for row in rows:
        total = sums.setdefault(
            row["family"], {"rows": 0, "trials": 0, "anomalies": 0, "seconds": 0.0, "control": []}
        )
        total["rows"] += 1
        total["trials"] += row["trials"]
        total["anomalies"] += row["anomalies"]
        total["seconds"] += row["seconds"]
        total["control"].append(row["control_caught"])
    print()
    print("| family, summed over its parts | rows | trials | anomalies | every control caught |")
    print("|---|---:|---:|---:|---|")
    for family, total in sums.items():
        controls = [caught for caught in total["control"] if caught is not None]
        caught = None if not controls else all(controls)
        print(
            f"| {family} | {total['rows']} | {total['trials']:,} | {total['anomalies']:,} "
            f"| {_control(caught)} |"
        )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
