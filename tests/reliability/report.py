"""Print the figures recorded by a reliability run as a markdown table.

Usage: ``python tests/reliability/report.py FIGURES.jsonl``; exits non-zero
when the file is missing or any harness shows an anomaly or an uncaught
negative control.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


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
        print(
            f"| {row['family']} | {row['trials']:,} | {row['anomalies']:,} "
            f"| {_control(row['control_caught'])} | {row['seconds']:.1f} | {row['detail']} |"
        )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
