"""Several runs' JSON reports as one table: the median of each row's medians and their range.

One run on a shared machine can be an outlier; the figures published in
docs/performance.md are three full runs read together. Usage::

    python benchmarks/summary.py run1.json run2.json run3.json
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HEADER = (
    "| row | ops/s median [range] | p99 ms [range] | ratio [range] | peer ratio [range] |",
    "|---|---|---|---|---|",
)


def _spread(values: Sequence[float], digits: int) -> str:
    """Return ``median [min-max]`` of ``values`` rounded to ``digits``; empty is a dash."""
    if not values:
        return "-"
    fmt = f"{{:,.{digits}f}}"
    middle = fmt.format(statistics.median(values))
    return f"{middle} [{fmt.format(min(values))}\u2013{fmt.format(max(values))}]"


def _rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        row
        for scenario in report["scenarios"].values()
        if scenario["status"] == "ok"
        for row in scenario["rows"]
    ]


def summarise(reports: Sequence[dict[str, Any]]) -> list[str]:
    """Return the markdown lines of the table, rows in the first report's order."""
    by_id: dict[str, list[dict[str, Any]]] = {}
    labels: dict[str, str] = {}
    for report in reports:
        for row in _rows(report):
            by_id.setdefault(row["id"], []).append(row)
            labels.setdefault(row["id"], f"{row['id']} {row['label']}")
    lines = list(HEADER)
    for row_id, rows in by_id.items():
        rates = [row["ops_per_s"]["median"] for row in rows]
        p99 = [row["p99_ms"] for row in rows if row.get("p99_ms") is not None]
        ratios = [row["ratio"] for row in rows if row.get("ratio") is not None]
        peer = [row["peer_ratio"] for row in rows if row.get("peer_ratio") is not None]
        cells = (
            f"{labels[row_id]} ({len(rows)} runs)",
            _spread(rates, 0),
            _spread(p99, 2),
            _spread(ratios, 3),
            _spread(peer, 3),
        )
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: Sequence[str]) -> int:
    """Print the table of the reports named in ``argv``; exit 2 without any."""
    if not argv:
        print("usage: summary.py REPORT.json [REPORT.json ...]", file=sys.stderr)
        return 2
    reports = [json.loads(Path(name).read_text(encoding="utf-8")) for name in argv]
    dates = ", ".join(str(report["metadata"]["date"]) for report in reports)
    print(f"{len(reports)} runs: {dates}")
    print("\n".join(summarise(reports)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
