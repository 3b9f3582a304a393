"""Benchmark: what rendering our program costs beside a bare Pulumi program of the same size.

    .venv/bin/python bench/render_cost.py [--items example,1,10,100,500] [--repeat 3] [--max-ratio 1.5]

Items: `example` is Pulumi.test.yaml as committed; a number N is the same stack file with its projects
replaced by one project of N entities (kinds in rotation, all built from entities/shop/cart).

Every measurement is one fresh process, started by this one with the same interpreter, environment
and working directory, and reaped with os.wait4: its CPU time (user + system) and peak memory are
the kernel's figures for that process alone, and wall time runs from spawn to exit. Interpreter
start-up, every import, the output files and the interpreter's exit all count. Both children's own
modules are byte-compiled first (the scratch copy's, and cloudstation_tools/ here for the bare
program), as any second run of Python finds them: with PYTHONDONTWRITEBYTECODE set (as on the
machine these numbers come from) every run would otherwise compile them again, ~10k lines for the
program against a few hundred for the bare one.

- program: `python -m infra render --stack test --out DIR`, the command itself, in a scratch copy of
  the repository (infra/, components/, entities/, __main__.py, Pulumi*.yaml) whose Pulumi.test.yaml is the item.
- bare: a bare Pulumi program with as many resources as the program registered (components
  included): `import pulumi, pulumi_kubernetes`, the same mocks and monitor (cloudstation_tools.mocks
  ProgramMocks and RecordingMonitor, preview=False, one `@pulumi.runtime.test` run, as
  cloudstation_tools/render.py runs the program), one explicit kubernetes Provider and ConfigMaps of one data key
  for the rest; no components, no config, Python's default garbage collection; its registrations
  written by the same writer (cloudstation_tools/render_output.py, which loads neither the program nor its config).
  The goal is program CPU <= 1.5 x bare CPU.
  Both register their Kubernetes objects through pulumi-kubernetes' own generated classes.

Two diagnostics, to show where the rest goes:

- bare-gc: the bare program with the command's GC policy (cyclic collector off for the whole
  process: cloudstation_tools/cli.py, infra/program.py; heap frozen at exit: infra/__main__.py).
- replay: the program's own registrations (its resources.json) registered again, flat, through
  Pulumi's generic resource classes (same types, names, parents, providers and inputs), with the
  command's GC policy: what Pulumi and the mocks cost for exactly these objects, without our code,
  config, or pulumi_kubernetes' typed classes and modules.

The four run interleaved `--repeat` times; the median of each is reported. Ratios are of CPU time,
which other load on the machine skews far less than wall time. With `--max-ratio`, the exit status
is 1 when an item's program/bare ratio exceeds it.
"""
from __future__ import annotations

import argparse
import compileall
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
KINDS = ["event-sourced", "replicated", "action"]
COPIED = ("infra", "cloudstation_tools", "components", "entities")


def stack_file(entities: int | None):
    """Pulumi.test.yaml's config; with `entities`, one project of that many entities instead."""
    from cloudstation_tools.render import StackFile

    base = StackFile.read("test", ROOT)
    if entities is not None:
        project = {
            "name": "bench",
            "entities": [
                {"name": f"e{i}", "kind": KINDS[i % 3], "language": "javascript", "source": "entities/shop/cart"}
                for i in range(entities)
            ],
        }
        base.values["cloudstation:projects"] = json.dumps([project])
    return base


def project_copy(item: str, scratch: Path, source: Path = ROOT) -> Path:
    """A copy of the program in `source` (default: this repository) whose Pulumi.test.yaml is
    `item`'s, byte-compiled (see the docstring)."""
    import yaml

    root = scratch / f"repo-{item}"
    for part in COPIED:
        if not (source / part).is_dir():
            continue  # a --program-from revision before cloudstation_tools/ existed (its CLI was in infra/)
        shutil.copytree(source / part, root / part, ignore=shutil.ignore_patterns("node_modules", ".cloudstation"))
    for path in [*source.glob("Pulumi*.yaml"), *source.glob("__main__.py")]:  # the program's entry point
        shutil.copy2(path, root / path.name)
    if item != "example":
        document = yaml.safe_load((ROOT / "Pulumi.test.yaml").read_text())
        document["config"]["cloudstation:projects"] = json.loads(stack_file(int(item)).values["cloudstation:projects"])
        (root / "Pulumi.test.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    compileall.compile_dir(root, quiet=1)
    return root


# --- the children ----------------------------------------------------------------------------------


def _under_mocks(program) -> list:
    """Run `program()` once as cloudstation_tools/render.py runs the real one: fresh mocks and monitor, preview=False."""
    import pulumi
    import pulumi.runtime.settings

    from cloudstation_tools.mocks import ProgramMocks, RecordingMonitor

    mocks = ProgramMocks()
    pulumi.runtime.settings.ROOT.set(None)
    pulumi.runtime.set_mocks(mocks, project="bare", stack="test", preview=False, monitor=RecordingMonitor(mocks))
    pulumi.runtime.test(program)()
    return sorted(mocks.registrations, key=lambda r: r.urn), mocks


def _write(out: Path, registrations: list, mocks) -> None:
    from cloudstation_tools import render_output

    render_output.write(out, "test", registrations, {}, mocks.made_up, mocks.reads)


def run_bare(resources: int, out: Path) -> None:
    import pulumi
    import pulumi_kubernetes as k8s

    def program():
        provider = k8s.Provider("kubernetes", enable_server_side_apply=True)
        opts = pulumi.ResourceOptions(provider=provider)
        maps = [
            k8s.core.v1.ConfigMap(f"cm-{i}", metadata={"name": f"cm-{i}"}, data={"k": "v"}, opts=opts)
            for i in range(resources - 1)
        ]
        return pulumi.Output.all(*[m.id for m in maps])

    _write(out, *_under_mocks(program))


def run_replay(resources_json: Path, out: Path) -> None:
    import pulumi

    entries = json.loads(resources_json.read_text())

    def program():
        made: dict[str, pulumi.Resource] = {}
        for entry in sorted(entries, key=lambda e: e["urn"].split("::")[2].count("$")):  # parents first
            provider = made.get((entry["provider"] or "").rsplit("::", 1)[0])
            opts = pulumi.ResourceOptions(parent=made.get(entry["parent"]), provider=provider)
            if entry["type"].startswith("pulumi:providers:"):
                package = entry["type"].rsplit(":", 1)[-1]
                made[entry["urn"]] = pulumi.ProviderResource(package, entry["name"], entry["inputs"], opts)
            elif entry["custom"]:
                made[entry["urn"]] = pulumi.CustomResource(entry["type"], entry["name"], entry["inputs"], opts)
            else:
                component = pulumi.ComponentResource(entry["type"], entry["name"], None, opts)
                component.register_outputs({})
                made[entry["urn"]] = component

    _write(out, *_under_mocks(program))


# --- the parent ------------------------------------------------------------------------------------


def _child(command: list[str], cwd: Path) -> dict:
    """Run one process to its end: wall seconds, CPU seconds and peak MB of that process alone."""
    started = time.perf_counter()
    with tempfile.TemporaryFile() as errors:
        process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=errors)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        elapsed = time.perf_counter() - started
        if process.returncode != 0:
            errors.seek(0)
            raise SystemExit(f"{' '.join(command)} failed:\n{errors.read().decode()}")
    return {"seconds": elapsed, "cpu": usage.ru_utime + usage.ru_stime, "mb": usage.ru_maxrss / 1024}


def _median(runs: list[dict]) -> dict:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def _bench(*args: str, gc_policy: bool = False) -> list[str]:
    return [sys.executable, __file__, *args, *(["--gc-policy"] if gc_policy else [])]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", "--sizes", default="example,1,10,100,500",
                        help="comma-separated: `example` and/or entity counts")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each process per item (median reported)")
    parser.add_argument("--max-ratio", type=float, help="exit 1 when an item's program/bare CPU ratio exceeds this")
    parser.add_argument("--program-from", type=Path, default=ROOT,
                        help="a checkout whose program to measure (default: this one), e.g. to compare before/after")
    parser.add_argument("--bare", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--replay", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--gc-policy", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare is not None or args.replay is not None:
        if args.gc_policy:
            gc.disable()  # as cloudstation_tools/cli.py `_render` does, before anything of Pulumi is loaded
        if args.bare is not None:
            run_bare(args.bare, Path(args.out))
        else:
            run_replay(Path(args.replay), Path(args.out))
        if args.gc_policy:
            gc.freeze()  # as infra/__main__.py does before exiting
        return 0

    print("CPU s (wall s) of one fresh process, median of --repeat; ratio: program/bare CPU (goal <= 1.5);")
    print("bare-gc and replay are diagnostics (see the docstring): program/bare-gc, program/replay CPU")
    print(f"{'item':>7} {'res':>5} {'program':>13} {'bare':>12} {'ratio':>5} {'bare-gc':>12} {'ratio':>5} "
          f"{'replay':>12} {'ratio':>5} {'ms/entity':>9} {'ms/res':>6} {'bare ms/res':>11} {'MB':>4} {'bare MB':>7}")
    worst = 0.0
    compileall.compile_dir(ROOT / "cloudstation_tools", quiet=1)  # what the bare program imports of ours
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        for item in args.items.split(","):
            root = project_copy(item, scratch, args.program_from)
            out = scratch / f"out-{item}"
            runs: dict[str, list[dict]] = {"program": [], "bare": [], "bare-gc": [], "replay": []}
            for _ in range(args.repeat):
                runs["program"].append(_child([sys.executable, "-m", "infra", "render", "--stack", "test",
                                               "--out", str(out / "program")], root))
                resources = len(json.loads((out / "program" / "resources.json").read_text()))
                runs["bare"].append(_child(_bench("--bare", str(resources), "--out", str(out / "bare")), root))
                runs["bare-gc"].append(_child(_bench("--bare", str(resources), "--out", str(out / "bare-gc"),
                                                     gc_policy=True), root))
                runs["replay"].append(_child(_bench("--replay", str(out / "program" / "resources.json"),
                                                    "--out", str(out / "replay"), gc_policy=True), root))
            program, bare, bare_gc, replay = (_median(runs[k]) for k in ("program", "bare", "bare-gc", "replay"))
            ratio = program["cpu"] / bare["cpu"]
            worst = max(worst, ratio)
            per_entity = "" if item == "example" else f"{1000 * program['cpu'] / int(item):.1f}"
            print(
                f"{item:>7} {resources:>5} {_seconds(program):>13} {_seconds(bare):>12} {ratio:>5.2f} "
                f"{_seconds(bare_gc):>12} {program['cpu'] / bare_gc['cpu']:>5.2f} "
                f"{_seconds(replay):>12} {program['cpu'] / replay['cpu']:>5.2f} {per_entity:>9} "
                f"{1000 * program['cpu'] / resources:>6.2f} {1000 * bare['cpu'] / resources:>11.2f} "
                f"{program['mb']:>4.0f} {bare['mb']:>7.0f}",
                flush=True,
            )
            shutil.rmtree(root)
    if args.max_ratio is not None and worst > args.max_ratio:
        print(f"worst ratio {worst:.2f} is above {args.max_ratio}")
        return 1
    return 0


def _seconds(run: dict) -> str:
    return f"{run['cpu']:.2f} ({run['seconds']:.2f})"


if __name__ == "__main__":
    sys.exit(main())
