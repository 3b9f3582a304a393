"""The whole program with its builds run for real, for tests/test_builds_program.py and bench/builds.py.

`run(copy, stack, ...)` runs the program (`__main__.py`) of a repository copy under the mocks, in a process of
its own started in that copy (the program finds its sources from its own location, infra/context.py
ROOT, so an edited copy must run its own code), with `ProgramMocks(dynamic=DynamicProviderHost(...))`:
the EntityBuild resources (and, with `queues=True`, the Armada Queue resources) run their real
providers as the engine would (cloudstation_tools/mocks.py), against whatever Armada and registry
`platform` points the stack at (the fake Armada, the fake executor and a real docker-registry in the
tests). The engine's checkpoint between runs is `state` (resource name -> (id, outputs)); pass the
previous run's to model a `pulumi up` of a deployed stack, none for a fresh one.

The child writes one JSON file: the error (if the program failed), every registration (secrets
redacted, as resources.json), the outputs, the provider calls and the new state.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

STATEFUL_SERVICE = "kubernetes:cloudstate.io/v1alpha1:StatefulService"
ENTITY_BUILD = "pulumi-python:dynamic/builds:EntityBuild"


@dataclass
class Run:
    error: Optional[str]
    resources: list[dict]
    outputs: dict
    calls: list[tuple[str, str]]
    state: dict
    seconds: float
    stderr: str = ""
    phases: dict = field(default_factory=dict)

    def of_type(self, type_: str) -> list[dict]:
        return [r for r in self.resources if r["type"] == type_]

    def stateful_services(self) -> dict[str, dict]:
        """StatefulService name -> its inputs."""
        return {r["inputs"]["metadata"]["name"]: r for r in self.of_type(STATEFUL_SERVICE)}

    def created(self) -> list[str]:
        return [name for method, name in self.calls if method in ("create", "update")]


def run(copy: Path, stack: str, *, platform: Optional[dict] = None, state: Optional[dict] = None,
        preview: bool = False, queues: bool = False, connect_wait: Optional[float] = None,
        timeout: float = 300) -> Run:
    """Run the program of `copy` for `stack` (see the module docstring); `platform` is deep-merged
    over the stack file's `cloudstation:platform`."""
    spec = {"stack": stack, "platform": platform or {}, "state": state or {}, "preview": preview,
            "queues": queues, "connect_wait": connect_wait, "out": str(copy / f".run-{time.monotonic_ns()}.json")}
    started = time.monotonic()
    env = {**os.environ, "PYTHONPATH": str(copy)}
    spec_file = copy / f".spec-{time.monotonic_ns()}.json"  # a checkpoint is too long for argv
    spec_file.write_text(json.dumps(spec))
    try:
        process = subprocess.run([sys.executable, "-m", "tests.builds_program", str(spec_file)], cwd=copy, env=env,
                                 capture_output=True, text=True, timeout=timeout)
    finally:
        spec_file.unlink()
    seconds = time.monotonic() - started
    out = Path(spec["out"])
    if process.returncode != 0 or not out.is_file():
        raise RuntimeError(f"the program runner failed ({process.returncode}):\n{process.stdout}\n{process.stderr}")
    answer = json.loads(out.read_text())
    out.unlink()
    return Run(answer["error"], answer["resources"], answer["outputs"], [tuple(c) for c in answer["calls"]],
               answer["state"], seconds, process.stderr, answer.get("phases", {}))


def _merge(base: Any, override: Any) -> Any:
    if isinstance(base, dict) and isinstance(override, dict):
        return {**base, **{k: _merge(base.get(k), v) for k, v in override.items()}}
    return override


def main(argv: list[str]) -> None:
    """The child: runs in the copy, writes the answer file."""
    spec = json.loads(Path(argv[1]).read_text())
    started = time.monotonic()
    from cloudstation_tools import render as render_module
    from cloudstation_tools.mocks import DynamicProviderHost, ProgramMocks, is_entity_build
    from cloudstation_tools.render_output import resources
    from components import entity_build

    if spec["connect_wait"] is not None:
        # Test knob: how long a build retries an Armada that refuses connections (30 s for real).
        entity_build.CONNECT_WAIT_SECONDS = spec["connect_wait"]
    root = Path.cwd()
    stack = spec["stack"]
    stack_file = render_module.StackFile.read(stack, root)
    key = "cloudstation:platform"
    stack_file.values[key] = json.dumps(_merge(json.loads(stack_file.values.get(key, "{}")), spec["platform"]))

    def runs(typ: str) -> bool:
        return is_entity_build(typ) or (spec["queues"] and typ == "pulumi-python:dynamic/armada:Queue")

    host = DynamicProviderHost(types=runs, state={name: tuple(value) for name, value in spec["state"].items()})
    mocks = ProgramMocks(dynamic=host)
    imported = time.monotonic()
    error, outputs = None, {}
    try:
        outputs = render_module.render(stack, root, stack_file, mocks, preview=spec["preview"]).outputs
    except BaseException as failure:  # noqa: BLE001 - reported to the test, which decides
        error = f"{type(failure).__name__}: {failure}"
    finished = time.monotonic()
    answer = {
        "error": error,
        "resources": resources(mocks.registrations),
        "outputs": outputs,
        "calls": [(call.method, call.name) for call in host.calls],
        "state": {name: list(value) for name, value in host.state.items()},
        "phases": {"imports": imported - started, "program": finished - imported},
    }
    Path(spec["out"]).write_text(json.dumps(answer, default=str))


if __name__ == "__main__":
    main(sys.argv)
