"""The last lines of `make test` and `make coverage`: how many tests skipped and why, over every
pytest run of the command; with --coverage (`make coverage`), first the coverage of the `switchyard`
package (lines and branches), by package and for the five least-covered modules, exiting 1 when
the total is under the floor (`fail_under` in pyproject.toml's [tool.coverage.report]).

    python -m tests.run_summary [--skips FILE] [--coverage]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
from pathlib import Path

import coverage

PACKAGE = "switchyard"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skips", type=Path, help="the skip records the suite's runs wrote (SWITCHYARD_TEST_SKIPS)")
    parser.add_argument("--coverage", action="store_true", help="first the coverage the runs measured")
    args = parser.parse_args(argv)
    ok = print_coverage() if args.coverage else True
    if args.skips is not None:
        print_skips(args.skips)
    return 0 if ok else 1


def print_coverage() -> bool:
    cov = coverage.Coverage()
    cov.load()
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "coverage.json"
        cov.json_report(outfile=str(out))
        files = json.loads(out.read_text())["files"]
    floor = float(cov.get_option("report:fail_under") or 0)
    total = percent(file["summary"] for file in files.values())
    print(f"\ncoverage of {PACKAGE} (lines and branches): {total:.1f}% (floor {floor:g}%)")
    by_package: dict[str, list[dict]] = collections.defaultdict(list)
    for name, file in files.items():
        parts = Path(name).parts  # switchyard/proxy/relay.py, or switchyard/cli.py for the commands
        by_package[parts[1] if len(parts) > 2 else "cli"].append(file["summary"])
    print("  by package: " + ", ".join(f"{pkg} {percent(s):.0f}%" for pkg, s in sorted(by_package.items())))
    least = sorted(files.items(), key=lambda item: (ratio(item[1]["summary"]), item[0]))[:5]
    print("  least covered: " + ", ".join(f"{name} {100 * ratio(f['summary']):.0f}%" for name, f in least))
    if total < floor:
        print(f"coverage {total:.1f}% is under the floor of {floor:g}%")
        return False
    return True


def ratio(summary: dict) -> float:
    return percent([summary]) / 100


def percent(summaries) -> float:
    """Covered lines plus covered branch outcomes, over all lines plus branch outcomes (coverage.py's own %)."""
    covered = possible = 0
    for s in summaries:
        covered += s["covered_lines"] + s.get("covered_branches", 0)
        possible += s["num_statements"] + s.get("num_branches", 0)
    return 100.0 * covered / possible if possible else 100.0


def print_skips(path: Path) -> None:
    records = {}
    if path.exists():
        for line in path.read_text().splitlines():
            record = json.loads(line)
            records[record["nodeid"]] = record["reason"]
    if not records:
        print("skipped: none")
        return
    print(f"skipped: {len(records)}")
    for reason, count in collections.Counter(records.values()).most_common():
        print(f"  {count:>3}  {reason}")


if __name__ == "__main__":
    sys.exit(main())
