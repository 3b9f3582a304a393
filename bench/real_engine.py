"""Benchmark: what users wait for, with the real engine: `pulumi preview` and a no-change `pulumi up`.

    .venv/bin/python bench/real_engine.py --tools FILE [--items example,500] [--repeat 3]

`--tools` is e2e/build-tools.sh's output (`bash e2e/build-tools.sh > FILE`). Each item runs on its own
end-to-end platform (e2e/platform.py: real API server, kwok nodes, the real Pulumi CLI and
pulumi-resource-kubernetes, the registry and Armada stand-ins): `example` is the tree's test stack,
a number N the same stack with one project of N entities (bench/render_cost.py `stack_file`). The
stack is deployed once (`scripts/up.sh test`, timed and reported, not compared), then, interleaved
`--repeat` times, `pulumi preview` and `pulumi up` (which finds nothing to do) are timed with the
program registering its Kubernetes objects through components/kube.py and through
pulumi-kubernetes' generated classes (`UPSTREAM = True` in the copy's components/kube.py): the same
registrations (tests/test_kube_light.py), so the same plan. Reported: the median wall time and CPU
(the pulumi process and every descendant it reaped: language host, program, plugins), and the
program's own CPU under mocks as bench/render_cost.py measures it (`python -m infra render`),
for both ways. kube.py stays only while it saves at least 10 % of the wall time of a real preview
at 500 entities (issue 19); `--min-saving 0.10` makes the exit status say whether it does.
"""
from __future__ import annotations

import argparse
import json
import os
import re
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

WAYS = ("kube.py", "upstream")


def timed(platform: Platform, *args: str) -> dict:
    """One command in the copy, its wall time and the CPU of its whole process tree (wait4)."""
    started = time.monotonic()
    process = subprocess.Popen(list(args), cwd=platform.repo, env=platform.env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
    output = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.monotonic() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{output.decode(errors='replace')[-3000:]}")
    return {"seconds": seconds, "cpu": usage.ru_utime + usage.ru_stime}


def set_way(platform: Platform, way: str) -> None:
    kube = platform.repo / "components" / "kube.py"
    text = re.sub(r"^UPSTREAM = (True|False)$", f"UPSTREAM = {way == 'upstream'}", kube.read_text(), flags=re.M)
    kube.write_text(text)


def use_item(platform: Platform, item: str) -> int:
    """The item's stack file in the copy; returns its entity count."""
    import yaml
    if item == "example":
        config = platform.config("test")
        return sum(len(p.entities) for p in config.projects)
    document = yaml.safe_load((platform.repo / "Pulumi.test.yaml").read_text())
    document["config"]["cloudstation:projects"] = json.loads(stack_file(int(item)).values["cloudstation:projects"])
    # kwok's nodes have room for it; the example's budget (3 CPU / 6 GiB) is a developer cluster's.
    document["config"]["cloudstation:platform"]["clusterBudget"] = {"cpu": "1000", "memory": "4000Gi"}
    (platform.repo / "Pulumi.test.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    return int(item)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tools", required=True, type=Path, help="e2e/build-tools.sh's output")
    parser.add_argument("--kubernetes", default="kubernetes-1.37")
    parser.add_argument("--items", default="example,500")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--min-saving", type=float, help="exit 1 when kube.py saves less of a preview at the largest item")
    args = parser.parse_args()
    tools = read_tools(args.tools)
    print("median of --repeat; wall s / CPU s of the whole pulumi process tree; program: its CPU s under mocks")
    print(f"{'item':>7} {'res':>5} {'way':>9} {'preview':>15} {'no-change up':>15} {'program':>8} {'first up':>9}")
    saving = None
    for item in args.items.split(","):
        with tempfile.TemporaryDirectory(prefix=f"bench-real-{item}-") as work:
            platform = Platform(Path(work), tools, args.kubernetes)
            try:
                platform.start()
                # The first up builds every entity (jobs through the fake executor); what is measured
                # comes after it, so the builds' own tests are not run here.
                platform.executor._run_tests = lambda data, entity, spec: (0, "not run by the benchmark")
                entities = use_item(platform, item)
                platform.pulumi("stack", "init", "test").check()
                first = timed(platform, "bash", "scripts/up.sh", "test")
                resources = len(json.loads((platform.repo / ".cloudstation/rendered/test/resources.json").read_text()))
                runs: dict[str, dict[str, list[dict]]] = {w: {"preview": [], "up": [], "program": []} for w in WAYS}
                with platform.port_forwards("test"):
                    for _ in range(args.repeat):
                        for way in WAYS:
                            set_way(platform, way)
                            runs[way]["preview"].append(timed(platform, "pulumi", "preview", "--stack", "test",
                                                              "--non-interactive", "--expect-no-changes"))
                            runs[way]["up"].append(timed(platform, "pulumi", "up", "--stack", "test", "--yes",
                                                         "--non-interactive", "--expect-no-changes"))
                            runs[way]["program"].append(timed(platform, str(platform.repo / ".venv/bin/python"), "-m",
                                                              "infra", "render", "--stack", "test", "--out",
                                                              ".cloudstation/bench"))
                set_way(platform, "kube.py")
            finally:
                platform.stop()
            medians = {w: {k: {m: statistics.median(r[m] for r in runs[w][k]) for m in ("seconds", "cpu")}
                           for k in runs[w]} for w in WAYS}
            for way in WAYS:
                m = medians[way]
                print(f"{item:>7} {resources:>5} {way:>9} {m['preview']['seconds']:>7.1f} / {m['preview']['cpu']:<5.1f} "
                      f"{m['up']['seconds']:>7.1f} / {m['up']['cpu']:<5.1f} {m['program']['cpu']:>8.2f} "
                      f"{first['seconds'] if way == WAYS[0] else float('nan'):>9.1f}", flush=True)
            saving = 1 - medians["kube.py"]["preview"]["seconds"] / medians["upstream"]["preview"]["seconds"]
            print(f"{item:>7}: kube.py saves {100 * saving:.1f} % of a preview's wall time, "
                  f"{100 * (1 - medians['kube.py']['up']['seconds'] / medians['upstream']['up']['seconds']):.1f} % "
                  f"of a no-change up's ({entities} entities)", flush=True)
    if args.min_saving is not None and saving is not None and saving < args.min_saving:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
