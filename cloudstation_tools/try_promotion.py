"""Try promotion locally: the whole test -> prod flow on this machine, without a cluster.

    python -m infra try-promotion [--keep]

1. starts a throwaway registry (Debian's `docker-registry`, htpasswd auth with a generated password)
   on a free loopback port, in a temporary directory;
2. pushes one small synthetic image (one file, built by hand as an OCI layout, copied with skopeo)
   for every entity of Pulumi.test.yaml, at the repository promotion expects
   (`<prefix>/<project>/<entity>`), plus a second version of one entity;
3. writes a `file://` state backend whose test-stack checkpoint has the `images` output a deployed
   test stack has (the format cloudstation_tools/state_backend.py reads), naming the images as the cluster's
   nodes would (`localhost:<nodePort>/...`, mapped to the throwaway registry with
   CLOUDSTATION_REGISTRY_ADDRESSES);
4. copies Pulumi.prod.yaml (and Pulumi.test.yaml, which prod's validation reads) to the temporary
   directory and runs the real commands there, printing each: promote --dry-run, promote, the
   history; a new test image promoted; rollback --dry-run, rollback, the history; the registry's tags;
5. stops the registry (by its own process) and removes the directory (kept with --keep).

The repository's files are never touched. Needs `docker-registry` and `skopeo`
(`apt-get install docker-registry skopeo`; scripts/test.sh installs them as root).
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator, Optional

from cloudstation_tools import promote, stack_file
from components import registry_api
from infra.image_refs import entity_repository, split

ROOT = Path(__file__).resolve().parent.parent
SOURCE, TARGET = "test", "prod"
USERNAME = "try-promotion"
PROJECT = "cloudstation"


class TryError(Exception):
    """The walk-through could not run; str() says why and what to install or fix."""


def entity_keys(root: Path = ROOT) -> list[str]:
    """`<project>/<entity>` of every entity the test stack deploys (its `images` output's keys)."""
    from cloudstation_tools.render import validate_config

    config = validate_config(SOURCE, root)
    return [f"{stack_file.PLATFORM_PROJECT}/{config.platform.project_state.name}"] + [
        f"{project.name}/{entity.name}" for project in config.projects for entity in project.entities
    ]


def checkpoint(stack: str, outputs: dict) -> dict:
    """A version 3 checkpoint as the Pulumi CLI writes it, with only the stack resource's outputs."""
    return {
        "version": 3,
        "checkpoint": {
            "stack": f"organization/{PROJECT}/{stack}",
            "latest": {
                "manifest": {"time": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "magic": "",
                             "version": "v3.272.0"},
                "resources": [{
                    "urn": f"urn:pulumi:{stack}::{PROJECT}::pulumi:pulumi:Stack::{PROJECT}-{stack}",
                    "custom": False, "type": "pulumi:pulumi:Stack", "outputs": outputs,
                }],
            },
        },
    }


def write_state(backend: Path, images: dict[str, str]) -> None:
    """The test stack's checkpoint in a file:// backend: what `pulumi up -s test` leaves there."""
    path = backend / ".pulumi" / "stacks" / PROJECT / f"{SOURCE}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(checkpoint(SOURCE, {promote.IMAGES_OUTPUT: images}), indent=1))


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _next_second() -> None:
    """Each change gets its own `prod-<time>` tag (they have one-second resolution)."""
    start = int(time.time())
    while int(time.time()) == start:
        time.sleep(0.05)


@dataclass
class Playground:
    """A throwaway registry holding synthetic `v1` and `v2` images of every test entity, a file://
    backend for the test stack's state, and the environment promote and rollback need for them."""

    work: Path
    registry: object
    images: dict[str, dict[str, str]]
    """`<project>/<entity>` -> {"repository": ..., "v1": ref, "v2": ref}, refs as the nodes name them."""
    environment: dict[str, str]

    @property
    def backend(self) -> Path:
        return self.work / "state"

    def deploy_test(self, versions: dict[str, str]) -> dict[str, str]:
        """Write the test stack's state as `pulumi up -s test` would: `images` with each entity's
        given version (`v1` or `v2`); returns that output."""
        images = {key: self.images[key][version] for key, version in versions.items()}
        write_state(self.backend, images)
        return images


@contextlib.contextmanager
def playground(project: Path, keys: Optional[list[str]] = None, keep: bool = False, print_=print) -> Iterator[Playground]:
    """A Playground for the stack files in `project` (the entities of its Pulumi.test.yaml, unless
    `keys` names them; the registry of its Pulumi.prod.yaml); the registry is stopped and its
    directory removed afterwards (unless `keep`)."""
    from tests.registry_server import RegistryServer, build_oci_image, require_tools

    try:
        require_tools()
    except RuntimeError as error:
        raise TryError(str(error)) from None
    parsed = stack_file.parse(stack_file.read_text(promote.stack_path(project, TARGET)), f"Pulumi.{TARGET}.yaml")
    node_host, prefix = promote.registry_of(parsed)
    keys = keys or entity_keys(project)
    work = Path(tempfile.mkdtemp(prefix="try-promotion-"))
    try:
        password = secrets.token_urlsafe(24)
        nonce = secrets.token_hex(8)  # new digests each run: never the images a previous run promoted
        with RegistryServer(work / "registry", username=USERNAME, password=password) as registry:
            jobs = []
            for key in keys:
                repository = entity_repository(prefix, *key.split("/", 1))
                for version in ("v1", "v2"):
                    image = build_oci_image(work / "oci", f"{key.replace('/', '-')}-{version}",
                                            f"{key} {version} {nonce}\n".encode(), label=f"{key} {version}")
                    jobs.append((key, version, repository, image))
            with ThreadPoolExecutor(4) as pool:  # skopeo, one process per image
                digests = list(pool.map(lambda job: registry.push(job[3], job[2], job[1]), jobs))
            images: dict[str, dict[str, str]] = {key: {} for key in keys}
            for (key, version, repository, _), digest in zip(jobs, digests):
                images[key].update({"repository": repository, version: f"{node_host}/{repository}:{version}@{digest}"})
            environment = {
                # The commands read the state file themselves, as CI without the Pulumi CLI does (a
                # `pulumi` on PATH would be asked instead, and want the project and a passphrase).
                "PATH": os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                                        if d and not os.access(Path(d) / "pulumi", os.X_OK)),
                "PULUMI_BACKEND_URL": f"file://{work / 'state'}",
                registry_api.HOST_ENV: node_host,
                registry_api.ADDRESSES_ENV: f"{node_host}={registry.host}",
                registry_api.USERNAME_ENV: USERNAME,
                registry_api.PASSWORD_ENV: password,
            }
            yield Playground(work, registry, images, environment)
    finally:
        if keep:
            print_(f"kept {work} (the registry is stopped; its data is in {work / 'registry'})")
        else:
            shutil.rmtree(work, ignore_errors=True)


class Walkthrough:
    def __init__(self, project: Path, place: Playground, print_=print):
        self.project, self.place, self.print = project, place, print_

    def run(self, *argv: str) -> None:
        from cloudstation_tools import cli

        self.print(f"$ python -m infra {shlex.join(argv)}")
        code = cli.main([*argv, "--root", str(self.project)])
        if code != 0:
            raise TryError(f"`python -m infra {shlex.join(argv)}` failed (exit {code}); see above")

    def show_history(self) -> None:
        path = promote.history_path(self.project, TARGET)
        self.print(f"history ({path.name}, one JSON record per line):")
        for line in path.read_text().splitlines():
            record = json.loads(line)
            self.print(f"  #{record['id']} {record['action']} {record['when']} {record['state']}"
                       + (f" undoes {record['undoes']}" if record.get("undoes") else "")
                       + f" tags {record['tags']}: " + ", ".join(
                           f"{key} -> :{split(ref)[2]}@{split(ref)[3][:19]}…" for key, ref in record["references"].items()))

    def show_tags(self, key: str) -> None:
        registry = self.place.registry
        repository = self.place.images[key]["repository"]
        listed = registry.session.get(f"{registry.url}/v2/{repository}/tags/list", auth=registry.auth, timeout=10).json()
        self.print(f"tags of {repository} in the registry: {', '.join(sorted(listed.get('tags') or []))}")

    def steps(self, changed: str) -> None:
        versions = {key: "v1" for key in self.place.images}
        self.place.deploy_test(versions)
        self.print("\n== 1. The test stack is deployed (its state has an `images` output); what would promote change?")
        self.run("promote", "--from", SOURCE, "--to", TARGET, "--dry-run")
        self.print("\n== 2. Promote: the image lines are written, each image is tagged, the promotion recorded")
        _next_second()
        self.run("promote", "--from", SOURCE, "--to", TARGET)
        self.show_history()
        self.print(f"\n== 3. Test deploys a new {changed}; promote again (only that line changes)")
        self.place.deploy_test({**versions, changed: "v2"})
        _next_second()
        self.run("promote", "--from", SOURCE, "--to", TARGET)
        self.show_history()
        self.print("\n== 4. Roll back the latest promotion")
        self.run("rollback", "--stack", TARGET, "--dry-run")
        _next_second()
        self.run("rollback", "--stack", TARGET)
        self.show_history()
        self.show_tags(changed)


def main(keep: bool = False, print_=print) -> int:
    """The walk-through, on copies of the repository's stack files in a temporary directory."""
    project = Path(tempfile.mkdtemp(prefix="try-promotion-project-"))
    try:
        for stack in (SOURCE, TARGET):
            shutil.copy(promote.stack_path(ROOT, stack), promote.stack_path(project, stack))
        with playground(project, entity_keys(ROOT), keep=keep, print_=print_) as place:
            keys = list(place.images)
            changed = next((key for key in keys if not key.startswith(f"{stack_file.PLATFORM_PROJECT}/")), keys[0])
            print_(f"A throwaway registry (docker-registry, htpasswd auth) at {place.registry.host}; work directory "
                   f"{place.work}")
            print_(f"Pushed synthetic v1 and v2 images of each test entity ({', '.join(keys)}).")
            print_(f"Every command below runs on a copy of Pulumi.{TARGET}.yaml in {project}, with:")
            for name, value in place.environment.items():
                if name != "PATH":
                    print_(f"  {name}={'(generated)' if name == registry_api.PASSWORD_ENV else value}")
            with _environment(place.environment):
                Walkthrough(project, place, print_).steps(changed)
        print_("\nThat is the whole flow: in a real project, commit Pulumi.prod.yaml and promotions.prod.jsonl, then "
               "`bash scripts/up.sh prod` (docs/promotion.md).")
    finally:
        if keep:
            print_(f"kept {project} (the stack files and the history)")
        else:
            shutil.rmtree(project, ignore_errors=True)
    return 0
