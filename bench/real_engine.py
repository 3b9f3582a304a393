"""Benchmark: what users wait for, with the real engine: `pulumi preview` and a no-change `pulumi up`.

    .venv/bin/python bench/real_engine.py --tools FILE [--items example,500] [--repeat 3]

`--tools` is e2e/build-tools.sh's output (`bash e2e/build-tools.sh > FILE`). Each item runs on its own
end-to-end platform (e2e/platform.py: real API server, kwok nodes, the real Pulumi CLI and
pulumi-resource-kubernetes, the registry and Armada stand-ins): `example` is the tree's test stack,
a number N the same stack with one project of N entities (bench/render_cost.py `stack_file`). The
stack is deployed once (`scripts/up.sh test`, timed), then `pulumi preview` and `pulumi up` (which
finds nothing to do) are timed `--repeat` times. Reported: the median wall time and CPU (the pulumi
process and every descendant it reaped: language host, program, plugins), and the program's own CPU
under mocks as bench/render_cost.py measures it (`python -m infra render`): how much of what users
wait for is our Python, and how much the engine and the provider.

components/kube.py, a stand-in for pulumi-kubernetes' generated classes that cut the program's CPU,
was measured here against the official classes and deleted (issue 19): at 100 entities (803
resources, 2 runs each) a preview took 9.9 s with it and 9.8 s without, a no-change up 21.1 s and
19.5 s; the program's CPU under mocks was 2.07 s against 2.55 s of the tree's ~12 s. The rule was to
keep it only for a saving of at least 10 % of a preview at 500 entities.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.render_cost import stack_file  # noqa: E402
from e2e.platform import Platform, read_tools  # noqa: E402

def timed(platform: Platform, *args: str) -> dict:
    """One command in the copy, its wall time and the CPU of its whole process tree (wait4)."""
    started = time.monotonic()
    # Its own process group: a stop by signal (main) ends the command with every plugin it started.
    process = subprocess.Popen(list(args), cwd=platform.repo, env=platform.env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # Read piece by piece in Python: a stop signal's handler runs between pieces (one read() to the
        # end would keep it waiting until the command ends).
        output = b"".join(iter(lambda: process.stdout.read1(65536), b""))
        _, status, usage = os.wait4(process.pid, 0)
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise
    seconds = time.monotonic() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{output.decode(errors='replace')[-3000:]}")
    return {"seconds": seconds, "cpu": usage.ru_utime + usage.ru_stime}


def use_item(platform: Platform, item: str) -> None:
    """The item's stack file in the copy."""
    import yaml
    if item == "example":
        return
    document = yaml.safe_load((platform.repo / "Pulumi.test.yaml").read_text())
    document["config"]["cloudstation:projects"] = json.loads(stack_file(int(item)).values["cloudstation:projects"])
    # kwok's nodes have room for it; the example's budget (3 CPU / 6 GiB) is a developer cluster's.
    document["config"]["cloudstation:platform"]["clusterBudget"] = {"cpu": "1000", "memory": "4000Gi"}
    (platform.repo / "Pulumi.test.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    # Only test is deployed; the example's prod names the example's projects, which `check` (run by
    # scripts/up.sh) would rightly refuse beside a test stack without them.
    (platform.repo / "Pulumi.prod.yaml").unlink()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tools", required=True, type=Path, help="e2e/build-tools.sh's output")
    parser.add_argument("--kubernetes", default="kubernetes-1.37")
    parser.add_argument("--items", default="example,500")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    tools = read_tools(args.tools)
    # A stop by signal (a CI timeout, kill) ends like Ctrl-C: the `finally` below stops the cluster.
    for stop in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, lambda number, _frame: sys.exit(128 + number))
    print("median of --repeat; wall s / CPU s of the whole pulumi process tree; program: its CPU s under mocks")
    print(f"{'item':>7} {'res':>5} {'preview':>15} {'no-change up':>15} {'program':>8} {'first up':>9}")
    for item in args.items.split(","):
        with tempfile.TemporaryDirectory(prefix=f"bench-real-{item}-") as work:
            platform = Platform(Path(work), tools, args.kubernetes)
            try:
                platform.start()
                # The first up builds every entity (jobs through the fake executor); what is measured
                # comes after it, so the builds' own tests are not run here.
                platform.executor._run_tests = lambda data, entity, spec: (0, "not run by the benchmark")
                use_item(platform, item)
                platform.pulumi("stack", "init", "test").check()
                first = timed(platform, "bash", "scripts/up.sh", "test")
                resources = len(json.loads((platform.repo / ".cloudstation/rendered/test/resources.json").read_text()))
                runs: dict[str, list[dict]] = {"preview": [], "up": [], "program": []}
                with platform.port_forwards("test"):
                    for _ in range(args.repeat):
                        runs["preview"].append(timed(platform, "pulumi", "preview", "--stack", "test",
                                                     "--non-interactive", "--expect-no-changes"))
                        runs["up"].append(timed(platform, "pulumi", "up", "--stack", "test", "--yes",
                                                "--non-interactive", "--expect-no-changes"))
                        runs["program"].append(timed(platform, str(platform.repo / ".venv/bin/python"), "-m", "infra",
                                                     "render", "--stack", "test", "--out", ".cloudstation/bench"))
            finally:
                platform.stop()
            m = {k: {q: statistics.median(r[q] for r in runs[k]) for q in ("seconds", "cpu")} for k in runs}
            print(f"{item:>7} {resources:>5} {m['preview']['seconds']:>7.1f} / {m['preview']['cpu']:<5.1f} "
                  f"{m['up']['seconds']:>7.1f} / {m['up']['cpu']:<5.1f} {m['program']['cpu']:>8.2f} "
                  f"{first['seconds']:>9.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
