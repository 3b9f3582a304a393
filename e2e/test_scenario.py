"""The scenario of the end-to-end tier (README, "End-to-end tests"), one test per step, in order, on
the stack files of the tree it runs in: the README's deploy path with the real Pulumi CLI, engine
and Kubernetes provider against a real API server."""
from __future__ import annotations

import json

import pytest

from e2e.platform import Platform


def stateful_services(platform: Platform, namespace: str) -> dict[str, dict]:
    found = platform.cluster.api("GET", f"/apis/cloudstate.io/v1alpha1/namespaces/{namespace}/statefulservices")
    return {item["metadata"]["name"]: item for item in (found or {}).get("items", [])}


def images_of(service: dict) -> list[str]:
    return [c["image"] for c in service["spec"].get("containers", [])]


def deployed_urns(platform: Platform, stack: str) -> set[str]:
    """URNs in the engine's state, but the stack itself and the default providers the engine adds."""
    exported = json.loads(platform.pulumi("stack", "export", "--stack", stack).check().stdout)
    return {r["urn"] for r in exported["deployment"].get("resources", [])
            if r["type"] != "pulumi:pulumi:Stack" and not r["urn"].split("::")[-1].startswith("default")}


def test_1_preview_and_up_test(platform: Platform):
    """The README's deploy path from an empty state backend: preview, then scripts/up.sh test."""
    platform.pulumi("stack", "init", "test").check()
    platform.pulumi("preview", "--stack", "test").check()  # nothing deployed yet: nothing to forward
    platform.pulumi("stack", "select", "test").check()
    platform.run("bash", "scripts/up.sh", "test").check()
    assert not platform.registry.errors, platform.registry.errors
    assert platform.registry.served, "no registry pod was ever served"
    # The offline render (up.sh wrote it first, under mocks) names exactly what the engine deployed:
    # the model of URNs the offline tools (render, diff, docs) rely on.
    rendered = {r["urn"] for r in json.loads((platform.repo / ".cloudstation/rendered/test/resources.json").read_text())}
    assert rendered and rendered == deployed_urns(platform, "test")


@pytest.mark.after("test_1_preview_and_up_test")
def test_2_no_changes_after_up_and_refresh(platform: Platform):
    with platform.port_forwards("test"):
        platform.pulumi("preview", "--stack", "test", "--expect-no-changes").check()
        platform.pulumi("refresh", "--stack", "test", "--yes").check()
        platform.pulumi("preview", "--stack", "test", "--expect-no-changes").check()


@pytest.mark.after("test_1_preview_and_up_test")
def test_3_promote_and_up_prod(platform: Platform):
    """docs/promotion.md's commands, then prod's deploy path; prod runs test's digests."""
    config = platform.config("test")
    registry = config.platform.registry
    password = platform.pulumi("stack", "output", "registryPassword", "--show-secrets", "--stack", "test").check()
    forward = platform.run("kubectl", "-n", config.platform.namespace, "get", "svc", "-o", "json").check()
    service = next(s["metadata"]["name"] for s in json.loads(forward.output)["items"]
                   if s["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "registry")
    import subprocess
    from e2e.cluster import free_port
    from e2e.platform import wait_for_port
    port = free_port()
    tunnel = subprocess.Popen(["kubectl", "-n", config.platform.namespace, "port-forward", f"svc/{service}",
                               f"{port}:5000"], env=platform.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port)
        platform.python("-m", "infra", "promote", "--from", "test", "--to", "prod", env={
            "CLOUDSTATION_REGISTRY_HOST": f"localhost:{registry.node_port}",
            "CLOUDSTATION_REGISTRY_USERNAME": registry.username,
            "CLOUDSTATION_REGISTRY_PASSWORD": password.output.strip().splitlines()[-1],
            "CLOUDSTATION_REGISTRY_ADDRESSES": f"localhost:{registry.node_port}=127.0.0.1:{port}",
        }).check()
    finally:
        tunnel.terminate()
        tunnel.wait(timeout=10)
    platform.pulumi("stack", "init", "prod").check()
    platform.run("bash", "scripts/up.sh", "prod").check()
    test_images = {name.split("-", 1)[-1]: images_of(s) for name, s in stateful_services(platform, "shop-test").items()}
    prod_images = {name.split("-", 1)[-1]: images_of(s) for name, s in stateful_services(platform, "shop-prod").items()}
    assert prod_images and prod_images == test_images
    assert all("@sha256:" in image for images in prod_images.values() for image in images)
    platform.pulumi("preview", "--stack", "prod", "--expect-no-changes").check()


def kept_objects(platform: Platform, stack: str) -> dict[str, str]:
    """`kind namespace/name` -> uid of every object `stack` keeps on delete (retainOnDelete), from
    the engine's own state (`pulumi stack export`)."""
    exported = json.loads(platform.pulumi("stack", "export", "--stack", stack).check().stdout)
    kept = {}
    for resource in exported["deployment"].get("resources", []):
        if resource.get("retainOnDelete") and resource["type"].startswith("kubernetes:") and resource.get("id"):
            kind = resource["type"].rsplit(":", 1)[-1]
            kept[f"{kind} {resource['id']}"] = resource.get("outputs", {}).get("metadata", {}).get("uid", "")
    return kept


def secret_data(platform: Platform, key: str) -> dict:
    namespace, name = key.split(" ", 1)[1].split("/")
    return (platform.cluster.api("GET", f"/api/v1/namespaces/{namespace}/secrets/{name}") or {}).get("data", {})


def live_uid(platform: Platform, key: str) -> str:
    kind, name = key.split(" ", 1)
    namespace, _, short = name.rpartition("/")
    result = platform.run("kubectl", "get", kind, short, *(["-n", namespace] if namespace else []),
                          "-o", "jsonpath={.metadata.uid}")
    return result.output.strip() if result.returncode == 0 else ""


@pytest.mark.after("test_3_promote_and_up_prod")
def test_5_destroy_and_up_prod_again_keeps_and_adopts(platform: Platform):
    kept = kept_objects(platform, "prod")
    assert kept, "prod keeps nothing on delete: expected at least the stores' claims"
    assert any(key.startswith("PersistentVolumeClaim ") for key in kept), sorted(kept)
    secrets = {key: secret_data(platform, key) for key in kept if key.startswith("Secret ")}
    assert secrets, "no kept Secret: the stores' credentials must stay with their data"
    platform.pulumi("destroy", "--stack", "prod", "--yes").check()
    gone = {key: uid for key, uid in kept.items() if live_uid(platform, key) != uid}
    assert not gone, f"kept objects deleted or replaced by pulumi destroy: {sorted(gone)}"
    platform.run("bash", "scripts/up.sh", "prod").check()
    replaced = {key: uid for key, uid in kept.items() if live_uid(platform, key) != uid}
    assert not replaced, f"claims and other kept objects not adopted as they were: {sorted(replaced)}"
    # A kept store opens only with the credentials its data was created with.
    changed = sorted(key for key, data in secrets.items() if secret_data(platform, key) != data)
    assert not changed, f"kept Secrets whose values the new up changed: {changed}"
    platform.pulumi("preview", "--stack", "prod", "--expect-no-changes").check()


def registry_repositories(platform: Platform) -> set[str]:
    import requests
    config = platform.config("test").platform.registry
    password = platform.pulumi("stack", "output", "registryPassword", "--show-secrets", "--stack", "test")
    answer = requests.get(f"{platform.registry.url}/v2/_catalog",
                          auth=(config.username, password.check().output.strip().splitlines()[-1]), timeout=10)
    answer.raise_for_status()
    return set(answer.json().get("repositories") or [])


def touch_entity(platform: Platform, project: str, entity: str) -> None:
    """A change to one entity's sources (a comment in its main file)."""
    source = platform.repo / next(e.source for p, e in __import__("infra.delivery", fromlist=["x"]).all_entities(
        platform.config("test")) if (p, e.name) == (project, entity))
    main = sorted(p for p in source.rglob("*.js") if "node_modules" not in p.parts and ".test." not in p.name)[0]
    main.write_text(main.read_text() + f"\n// e2e edit {len(platform.executor.jobs)}\n")


@pytest.mark.after("test_1_preview_and_up_test")
def test_7_builds_go_through_the_api_server_and_build_what_changed(platform: Platform):
    # The build contexts reached the registry: only through the EntityBuild's own tunnel through the
    # API server and kwok (nothing else knows the stand-in's port), and up.sh forwarded no registry.
    assert any(r.startswith("builds/") for r in registry_repositories(platform))
    forwards = platform.python("-m", "infra", "port-forwards", "--stack", "test").check().output
    assert "registry" not in forwards, forwards
    assert platform.executor.created, "no build pod was admitted by the API server"

    before = list(platform.executor.jobs)
    images = {n: images_of(s) for n, s in stateful_services(platform, "shop-test").items()}
    touch_entity(platform, "shop", "cart")
    platform.run("bash", "scripts/up.sh", "test").check()
    new_jobs = platform.executor.jobs[len(before):]
    assert len(new_jobs) == 1, f"one changed entity, {len(new_jobs)} build jobs"
    assert platform.armada.jobs[new_jobs[0]].item["labels"]["cloudstation.io/entity"] == "cart"
    after = {n: images_of(s) for n, s in stateful_services(platform, "shop-test").items()}
    assert after["shop-cart"] != images["shop-cart"]
    assert {n: i for n, i in after.items() if n != "shop-cart"} == {n: i for n, i in images.items() if n != "shop-cart"}

    platform.run("bash", "scripts/up.sh", "test").check()
    assert len(platform.executor.jobs) == len(before) + 1, "an unchanged stack submitted build jobs"


@pytest.mark.after("test_7_builds_go_through_the_api_server_and_build_what_changed")
def test_7_a_builder_pin_bump_rebuilds_every_entity(platform: Platform):
    versions_file = platform.repo / "infra" / "versions.py"
    original = versions_file.read_text()
    bumped = original.replace('"docker.io/martizih/kaniko:v1.28.3"', '"docker.io/martizih/kaniko:v1.28.4"')
    assert bumped != original, "the kaniko pin moved: update this test's bump"
    before = list(platform.executor.jobs)
    built = {n for n, s in stateful_services(platform, "shop-test").items()}
    versions_file.write_text(bumped)
    try:
        platform.run("bash", "scripts/up.sh", "test").check()
    finally:
        versions_file.write_text(original)
    rebuilt = {platform.armada.jobs[j].item["labels"]["cloudstation.io/entity"] for j in platform.executor.jobs[len(before):]}
    assert {f"shop-{e}" for e in rebuilt} >= built, f"a builder bump rebuilt only {sorted(rebuilt)}"
    # Back to the pins of the tree, so the steps after this one start from a stack without changes.
    platform.run("bash", "scripts/up.sh", "test").check()
    with platform.port_forwards("test"):
        platform.pulumi("preview", "--stack", "test", "--expect-no-changes").check()
