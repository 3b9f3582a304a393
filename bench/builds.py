"""Benchmark: in-cluster builds (`platform.builds.mode: armada`) of 50 entities, one of them changed.

    .venv/bin/python bench/builds.py [--entities 50]

In a temporary copy of the repository it generates a project `bench` of N JavaScript entities (copies
of the first JavaScript entity of the test stack file, each made distinct), points the test stack at a
fake Armada and fake executor (tests/fake_armada.py, tests/fake_executor.py: strict pod checks, the
context compared with the entity's files, the entity's `node --test`, a synthesized image pushed) and a
real docker-registry behind a counting proxy (tests/registry_server.py), and runs the whole program
with its dynamic providers for real (tests/builds_program.py):

1. a first `pulumi up` (every queue created, every entity built: N + project-state jobs);
2. nothing changed, with the first run's checkpoint (the engine's Diff finds nothing: no provider call);
3. nothing changed, without a checkpoint (a fresh stack: each build asks the registry for its tag);
4. one entity's source changed, with the checkpoint.

It prints, for runs 2-4, the jobs submitted, the bytes `pulumi up` sent to the registry (request
bodies: the changed entity's context only) and the program's time per entity, and fails if run 4
submitted anything but that one job or uploaded more than its context. Needs docker-registry, skopeo
and node (scripts/test.sh installs them).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from cloudstation_tools import render as render_module  # noqa: E402
from cloudstation_tools.mocks import kept_value  # noqa: E402
from components import build_context  # noqa: E402
from infra import builds, delivery  # noqa: E402
from tests.builds_program import run  # noqa: E402
from tests.fake_armada import FakeArmada  # noqa: E402
from tests.fake_executor import FakeExecutor  # noqa: E402
from tests.registry_server import CountingProxy, RegistryServer  # noqa: E402
from tests.stacks import copy_repository  # noqa: E402  (with the fixture stack files: tests/stacks/)

STACK = "test"
PROJECT = "bench"


def generate(copy: Path, count: int) -> list[str]:
    """Replace the test stack's projects with one of `count` entities copied from its first
    JavaScript entity; each gets a file of its own so that no two contexts are equal."""
    path = copy / f"Pulumi.{STACK}.yaml"
    document = yaml.safe_load(path.read_text())
    projects = document["config"]["cloudstation:projects"]
    template = next(e for p in projects for e in p["entities"] if e["language"] == "javascript")
    names = [f"e{index:03d}" for index in range(count)]
    for name in names:
        target = copy / "entities" / PROJECT / name
        shutil.copytree(copy / template["source"], target, ignore=shutil.ignore_patterns("node_modules"))
        (target / "bench-id.txt").write_text(f"{name}\n")
    document["config"]["cloudstation:projects"] = [{
        "name": PROJECT, "store": "postgres",
        "entities": [{"name": name, "kind": "replicated", "language": "javascript",
                      "source": f"entities/{PROJECT}/{name}"} for name in names],
    }]
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return names


def contexts(copy: Path):
    config = render_module.validate_config(STACK, copy)
    found = {(project, entity.name): (copy / entity.source,
                                      delivery.entity_dockerfile(copy, project, entity, config.platform.image_mirror)[1])
             for project, entity in delivery.all_entities(config)}
    return lambda project, entity: found[(project, entity)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entities", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cloudstation-bench-builds-") as temp:
        temp = Path(temp)
        copy = copy_repository(temp / "repo")
        names = generate(copy, args.entities)
        config = render_module.validate_config(STACK, copy)
        password = kept_value("registry-auth-values", "password", 32)
        with RegistryServer(temp / "registry", username=config.platform.registry.username, password=password) as registry, \
                CountingProxy(f"http://127.0.0.1:{registry.port}") as proxy, FakeArmada() as armada:
            with FakeExecutor(armada, registry, contexts(copy), registry_host=builds.registry_service_host(config)) as executor:
                platform = {"registry": {"pushHost": proxy.host},
                            "armada": {"queueApi": {"url": armada.url, "waitSeconds": 0}}}
                total = len(names) + 1  # and project-state

                def measured(label: str, **options) -> dict:
                    proxy.reset()
                    before = len(executor.jobs)
                    result = run(copy, STACK, platform=platform, timeout=1800, **options)
                    if result.error:
                        raise SystemExit(f"{label}: the program failed: {result.error}")
                    seen, _ = proxy.reset()
                    sent = sum(int(s.headers.get("Content-Length") or 0) for s in seen if s.method in ("PUT", "POST", "PATCH"))
                    row = {"run": label, "jobs": len(executor.jobs) - before, "registryRequests": len(seen),
                           "bytesSent": sent, "programSeconds": round(result.phases["program"], 3),
                           "msPerEntity": round(1000 * result.phases["program"] / total, 2), "state": result.state}
                    return row

                first = measured("first up (every entity)", queues=True)
                unchanged = measured("unchanged, deployed (checkpoint)", state=first["state"])
                fresh = measured("unchanged, fresh stack (no checkpoint)")
                changed_source = copy / "entities" / PROJECT / names[len(names) // 2] / "bench-id.txt"
                changed_source.write_text(changed_source.read_text() + "changed\n")
                context_bytes = len(build_context.context_tar(changed_source.parent, contexts(copy)(PROJECT, names[len(names) // 2])[1]))
                one = measured("one entity changed (checkpoint)", state=first["state"])
        rows = [first, unchanged, fresh, one]
        print(f"{args.entities} entities (+ project-state), builds.mode armada, fake Armada/executor, real registry")
        print(f"{'run':40} {'jobs':>5} {'registry req':>13} {'bytes sent':>11} {'program s':>10} {'ms/entity':>10}")
        for row in rows:
            print(f"{row['run']:40} {row['jobs']:>5} {row['registryRequests']:>13} {row['bytesSent']:>11} "
                  f"{row['programSeconds']:>10} {row['msPerEntity']:>10}")
        print(f"changed entity's context: {context_bytes} bytes (its tar); manifest and empty config add a few hundred")
        summary = {r["run"]: {k: v for k, v in r.items() if k != "state"} for r in rows}
        print(json.dumps({"contextBytes": context_bytes, "runs": summary}, indent=1))
        problems = []
        if unchanged["jobs"] or fresh["jobs"]:
            problems.append("an unchanged run submitted jobs")
        if one["jobs"] != 1:
            problems.append(f"one change submitted {one['jobs']} jobs")
        if not context_bytes <= one["bytesSent"] <= context_bytes + 4096:
            problems.append(f"one change sent {one['bytesSent']} bytes, its context is {context_bytes}")
        if problems:
            raise SystemExit("; ".join(problems))


if __name__ == "__main__":
    main()
