"""Benchmark: how long `cloudstation check` takes on the example stack files, per stack and per check.

    .venv/bin/python bench/check.py [--repeat 3] [--against REF] [--max-seconds 20]

Two measurements, each repeated and reported as the median:

- the command as a user runs it: `python -m infra check --format json` in a fresh process (interpreter
  start-up and every import included), wall and CPU time of that process alone (os.wait4);
- where the time goes: `cloudstation_tools.check.run` in this process, its timings per stack and per check
  (read and validate, render, schemas, policy pack, baseline, data left behind, clusters, budget).

The data-left-behind check renders a baseline only when there is something to compare: with a clean
working tree and no `.cloudstation/deployed/`, none; `--against HEAD~1` (or any ref) measures that cost.
With `--max-seconds`, the exit status is 1 when the command's median wall time exceeds it (a guard for CI
or a pre-push hook, not a test: timings depend on the machine).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def command(against: str | None) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, exit code) of one `python -m infra check` process."""
    argv = [sys.executable, "-m", "infra", "check", "--format", "json"] + (["--against", against] if against else [])
    started = time.perf_counter()
    process = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime, process.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--against", help="a git ref or render directory for the data-left-behind baseline")
    parser.add_argument("--max-seconds", type=float, help="exit 1 when the command's median wall time exceeds this")
    args = parser.parse_args()

    from cloudstation_tools import check

    runs = [command(args.against) for _ in range(args.repeat)]
    wall = statistics.median(r[0] for r in runs)
    cpu = statistics.median(r[1] for r in runs)
    codes = sorted({r[2] for r in runs})

    per: dict[tuple[str, str], list[float]] = defaultdict(list)
    totals: list[float] = []
    findings = None
    for _ in range(args.repeat):
        started = time.perf_counter()
        report = check.run(ROOT, against=args.against)
        totals.append(time.perf_counter() - started)
        sums: dict[tuple[str, str], float] = defaultdict(float)
        for stack, name, seconds in report.timings:
            sums[(stack, name)] += seconds
        for key, seconds in sums.items():
            per[key].append(seconds)
        findings = {s: report.count(s) for s in ("error", "warning", "notice")}

    print(f"cloudstation check on {ROOT.name}'s stack files, median of {args.repeat}")
    print(f"  the command (fresh process): {wall:.2f} s wall, {cpu:.2f} s CPU, exit {'/'.join(map(str, codes))}")
    print(f"  in process: {statistics.median(totals):.2f} s; findings {json.dumps(findings)}")
    stacks = sorted({stack for stack, _ in per})
    for stack in stacks:
        rows = sorted(((name, statistics.median(values)) for (s, name), values in per.items() if s == stack),
                      key=lambda row: -row[1])
        label = "across stacks" if stack == "*" else f"stack {stack}"
        print(f"  {label}: {sum(seconds for _, seconds in rows):.2f} s")
        for name, seconds in rows:
            print(f"    {name:<20} {seconds:6.3f} s")
    if args.max_seconds is not None and wall > args.max_seconds:
        print(f"slower than --max-seconds {args.max_seconds:g}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
