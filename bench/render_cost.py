"""Benchmark: what our program costs on top of Pulumi itself, per entity.

    .venv/bin/python bench/render_cost.py [--sizes 1,10,100,500]

For each size N, a fresh process renders the test stack with N entities (one project, entity kinds
in rotation) and reports wall time and peak memory; another fresh process runs a bare Pulumi program
that registers the same number of plain resources (ConfigMaps) under the same mocks. The ratio is
how much our code adds on top of Pulumi's own per-resource cost.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
KINDS = ["event-sourced", "replicated", "action"]


def stack_file(entities: int):
    from infra.render import StackFile

    base = StackFile.read("test", ROOT)
    project = {
        "name": "bench",
        "entities": [
            {"name": f"e{i}", "kind": KINDS[i % 3], "language": "javascript", "source": "entities/shop/cart"}
            for i in range(entities)
        ],
    }
    base.values["cloudstation:projects"] = json.dumps([project])
    return base


def measure_program(entities: int) -> dict:
    from infra import render

    started = time.perf_counter()
    rendered = render.render("test", ROOT, stack_file(entities))
    elapsed = time.perf_counter() - started
    return {"seconds": elapsed, "resources": len(rendered.registrations), "peak_mb": _peak_mb()}


def measure_bare(resources: int) -> dict:
    import pulumi
    import pulumi.runtime.settings
    import pulumi_kubernetes as k8s

    from infra.mocks import ProgramMocks, RecordingMonitor

    started = time.perf_counter()
    mocks = ProgramMocks()
    pulumi.runtime.set_mocks(mocks, project="bare", stack="bench", preview=False, monitor=RecordingMonitor(mocks))

    @pulumi.runtime.test
    def run():
        maps = [k8s.core.v1.ConfigMap(f"cm-{i}", metadata={"name": f"cm-{i}"}, data={"k": "v"}) for i in range(resources)]
        return pulumi.Output.all(*[m.id for m in maps])

    run()
    elapsed = time.perf_counter() - started
    return {"seconds": elapsed, "resources": len(mocks.registrations), "peak_mb": _peak_mb()}


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _child(*args: str) -> dict:
    result = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1,10,100,500")
    parser.add_argument("--program", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--bare", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.program is not None:
        print(json.dumps(measure_program(args.program)))
        return
    if args.bare is not None:
        print(json.dumps(measure_bare(args.bare)))
        return

    print(f"{'entities':>8} {'resources':>9} {'program s':>9} {'ms/entity':>9} {'peak MB':>8} "
          f"{'bare s':>7} {'bare ms/res':>11} {'bare MB':>8} {'time ratio':>10}")
    for size in [int(s) for s in args.sizes.split(",")]:
        program = _child("--program", str(size))
        bare = _child("--bare", str(program["resources"]))
        print(
            f"{size:>8} {program['resources']:>9} {program['seconds']:>9.2f} {1000 * program['seconds'] / size:>9.1f} "
            f"{program['peak_mb']:>8.0f} {bare['seconds']:>7.2f} "
            f"{1000 * bare['seconds'] / bare['resources']:>11.2f} {bare['peak_mb']:>8.0f} "
            f"{program['seconds'] / bare['seconds']:>10.2f}"
        )


if __name__ == "__main__":
    main()
