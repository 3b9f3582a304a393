"""The in-cluster build of one entity (components/build_job.py) and the namespace it runs in
(components/builds_namespace.py): the Armada job item is a strictly valid Pod for every supported
Kubernetes version, meets the builds namespace's Pod Security level and relaxes exactly the
"restricted" controls docs/builds.md names, carries the seam's labels and annotations, holds no
credential; its fetch script fetches, verifies and unpacks a real blob from a real registry; the
namespace's NetworkPolicies allow build pods nothing beyond DNS, the registry and the declared mirrors."""
from __future__ import annotations

import base64
import hashlib
import io
import ipaddress
import json
import shutil
import subprocess
import tarfile

import pytest
import requests
from pydantic import ValidationError

from cloudstation_tools import checks, validate
from components import build_job as bj
from components import network
from components.entity_build import job_item_of
from components.builds_namespace import (
    BUILD_POD_LABEL,
    BuildsNamespace,
    BuildsNamespaceArgs,
    basic_auth,
)
from components.registry_access import build_secret_name
from infra import versions
from tests.conftest import build as build_mocked

REGISTRY_HOST = "registry.cloudstation.svc.cluster.local:5000"
REGISTRY_LABELS = {"app.kubernetes.io/name": "registry", "app.kubernetes.io/instance": "registry"}
TAG = "0123456789abcdef0123456789abcdef"
DIGEST = "sha256:" + hashlib.sha256(b"context").hexdigest()
PASSWORD = "pw-Very-Secret-42"
USERNAME = "build-shop"
SECRET_NAME = build_secret_name("shop")
BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
"""pod-security-admission check_capabilities_baseline.go `capabilities_allowed_1_0` (unchanged 1.22-1.37)."""
MIRROR = bj.BuildEgress(hosts=["npm.example.com"], cidrs=["10.20.30.0/24"], ports=[443])
NEXUS = bj.BuildEgress(hosts=["nexus.tools.svc.cluster.local"], ports=[8081])


def item(settings: bj.BuildSettings | None = None, **overrides) -> dict:
    arguments = dict(project="shop", entity="cart", content_tag=TAG, context_digest=DIGEST,
                     registry_host=REGISTRY_HOST, namespace="cloudstation-builds", secret_name=SECRET_NAME,
                     settings=settings or bj.BuildSettings())
    arguments.update(overrides)
    return bj.build_job_item(**arguments)


def as_pod(job: dict) -> dict:
    """The pod Armada's executor creates from the item (its metadata; the spec as submitted)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "armada-job-1", "namespace": job["namespace"], "labels": dict(job["labels"]),
                         "annotations": dict(job["annotations"])},
            "spec": job["podSpec"]}


SETTINGS = [
    bj.BuildSettings(),
    bj.BuildSettings(user_namespace=False, egress=[MIRROR, NEXUS], registry_mirrors=["mirror.example.com/dockerhub"],
                     cpu=2, memory="4Gi", timeout_seconds=600,
                     image="docker.io/martizih/kaniko:v1.28.3@sha256:" + "c" * 64),
]


# --- the pod ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("settings", SETTINGS, ids=["defaults", "all-set"])
def test_the_item_is_a_strictly_valid_pod_for_every_supported_version(settings):
    pod = as_pod(item(settings))
    assert validate.validate_all([pod]) == []
    # And a broken one is caught (the validator is strict: unknown fields fail).
    broken = json.loads(json.dumps(pod))
    broken["spec"]["containers"][0]["securityContext"]["runAsUsr"] = 0
    assert validate.builtin_errors(broken, "1.33")


def test_the_item_has_exactly_the_submit_request_items_fields():
    """The swagger's apiJobSubmitRequestItem (v0.22.7): no field it does not define."""
    swagger_fields = {"annotations", "clientId", "externalJobUri", "ingress", "labels", "namespace", "podSpec",
                      "podSpecs", "priority", "requiredNodeLabels", "scheduler", "services"}
    job = item()
    assert set(job) <= swagger_fields
    assert {"namespace", "podSpec", "labels", "annotations"} <= set(job)
    assert all(isinstance(v, str) for part in ("labels", "annotations") for v in job[part].values())


def restricted_only(problem: str) -> bool:
    """A "restricted" control that "baseline" does not have (check IDs of pod-security-admission)."""
    return any(fragment in problem for fragment in (
        "allowPrivilegeEscalation", "capabilities must drop ALL", "adds capabilities", "runAsNonRoot",
        "runAsUser 0", "seccompProfile must be", "readOnlyRootFilesystem", " uses ["))


def baseline_violations(name: str, spec: dict) -> list[str]:
    """Violations of "baseline": checks.restricted_violations minus the restricted-only controls, plus
    baseline's own capability rule (adds only from its allow-list)."""
    problems = [p for p in checks.restricted_violations(name, spec) if not restricted_only(p)]
    for container in checks.all_containers(spec):
        added = set((container.get("securityContext") or {}).get("capabilities", {}).get("add") or [])
        if added - BASELINE_CAPABILITIES:
            problems.append(f"{name} container {container['name']}: adds {sorted(added - BASELINE_CAPABILITIES)}")
        if (container.get("securityContext") or {}).get("privileged"):
            problems.append(f"{name} container {container['name']}: privileged")
    return problems


@pytest.mark.parametrize("settings", SETTINGS, ids=["defaults", "all-set"])
def test_the_pod_meets_baseline_and_relaxes_exactly_the_documented_restricted_controls(settings):
    assert bj.POD_SECURITY_LEVEL == "baseline"
    spec = item(settings)["podSpec"]
    assert baseline_violations("Pod b", spec) == []
    assert checks.baseline_violations("Pod b", spec) == []  # what the fake executor checks (seam 6)
    relaxed = checks.restricted_violations("Pod b", spec)
    assert sorted(relaxed) == sorted([
        f"Pod b container build: adds capabilities {sorted(bj.BUILDER_CAPABILITIES)}",
        "Pod b container build: runAsNonRoot must be true",
        "Pod b container build: runAsUser 0",
    ])
    assert len(bj.RELAXED_RESTRICTED_CONTROLS) == 3
    assert set(bj.BUILDER_CAPABILITIES) <= BASELINE_CAPABILITIES
    # The fetch container meets "restricted" entirely; the build container keeps the rest of it.
    fetch, build = spec["initContainers"][0], spec["containers"][0]
    assert checks.restricted_violations("f", {"containers": [fetch]}) == []
    context = build["securityContext"]
    assert context["allowPrivilegeEscalation"] is False and context["capabilities"]["drop"] == ["ALL"]
    assert context["seccompProfile"] == {"type": "RuntimeDefault"} and "privileged" not in context
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        assert flag not in spec
    assert all("hostPath" not in volume for volume in spec["volumes"])


def test_the_baseline_check_catches_what_baseline_refuses():
    spec = item()["podSpec"]
    for change, fragment in [
        (lambda s: s["containers"][0]["securityContext"]["capabilities"]["add"].append("SYS_ADMIN"), "SYS_ADMIN"),
        (lambda s: s["containers"][0]["securityContext"].update(privileged=True), "privileged"),
        (lambda s: s["containers"][0]["securityContext"].update(seccompProfile={"type": "Unconfined"}), "seccomp"),
        (lambda s: s["containers"][0]["securityContext"].update(appArmorProfile={"type": "Unconfined"}), "appArmor"),
        (lambda s: s["volumes"].append({"name": "h", "hostPath": {"path": "/"}}), "hostPath"),
        (lambda s: s.update(hostNetwork=True), "hostNetwork"),
    ]:
        broken = json.loads(json.dumps(spec))
        change(broken)
        assert any(fragment in p for p in baseline_violations("Pod b", broken)), fragment


def test_the_pod_runs_in_its_own_user_namespace_unless_told_not_to():
    assert item()["podSpec"]["hostUsers"] is False
    assert "hostUsers" not in item(bj.BuildSettings(user_namespace=False))["podSpec"]


@pytest.mark.parametrize("settings", SETTINGS, ids=["defaults", "all-set"])
def test_no_token_no_service_links_requests_equal_limits_deadline_never_restart(settings):
    spec = item(settings)["podSpec"]
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    assert spec["restartPolicy"] == "Never" and spec["activeDeadlineSeconds"] == settings.timeout_seconds
    assert checks.resource_violations("b", spec) == []
    for container in checks.containers(spec):
        # Armada refuses limits above requests (submit_request.go validateResources).
        assert container["resources"]["requests"] == container["resources"]["limits"], container["name"]
    build = spec["containers"][0]["resources"]["requests"]
    assert (build["cpu"], build["memory"]) == (settings.cpu, settings.memory)
    # Armada refuses whole CPUs for init containers (validateInitContainerCpu).
    assert int(spec["initContainers"][0]["resources"]["requests"]["cpu"].rstrip("m")) % 1000 != 0


def test_images_are_the_pins():
    spec = item()["podSpec"]
    assert spec["initContainers"][0]["image"] == versions.IMAGES[bj.FETCH_IMAGE]
    assert versions.digest_of(spec["initContainers"][0]["image"])
    assert spec["containers"][0]["image"] == versions.IMAGES[bj.BUILDER_IMAGE]
    assert checks.image_violations("b", spec) == []
    mirrored = item(image_mirror="mirror.example:5000/hub")["podSpec"]
    assert mirrored["initContainers"][0]["image"] == versions.image(bj.FETCH_IMAGE, "mirror.example:5000/hub")
    assert mirrored["containers"][0]["image"] == versions.image(bj.BUILDER_IMAGE, "mirror.example:5000/hub")
    assert item(SETTINGS[1], image_mirror="mirror.example:5000/hub")["podSpec"]["containers"][0]["image"] == SETTINGS[1].image
    assert bj.BuildSettings().rebuild_key() != bj.BuildSettings(image=SETTINGS[1].image).rebuild_key()
    assert bj.BuildSettings().rebuild_key() == bj.BuildSettings(cpu="3", egress=[MIRROR]).rebuild_key()


def test_labels_and_annotations_follow_the_seam():
    job = item(repository_prefix="")
    assert job["labels"] == {"cloudstation.io/project": "shop", "cloudstation.io/entity": "cart",
                             "cloudstation.io/content-tag": TAG}
    assert job["annotations"] == {
        "cloudstation.io/build-context": f"{REGISTRY_HOST}/builds/shop/cart@{DIGEST}",
        "cloudstation.io/build-image": f"{REGISTRY_HOST}/shop/cart:{TAG}",
    }
    assert job["namespace"] == "cloudstation-builds"
    build = job["podSpec"]["containers"][0]
    assert f"--destination={REGISTRY_HOST}/shop/cart:{TAG}" in build["args"]
    assert "--context=dir:///workspace" in build["args"] and "--dockerfile=Dockerfile" in build["args"]
    # Plain HTTP for the in-cluster registry only; never for every registry.
    assert f"--insecure-registry={REGISTRY_HOST}" in build["args"] and "--insecure" not in build["args"]
    env = {e["name"]: e["value"] for e in job["podSpec"]["initContainers"][0]["env"]}
    assert env == {"CONTEXT_URL": f"http://{REGISTRY_HOST}/v2/builds/shop/cart/blobs/{DIGEST}",
                   "CONTEXT_SHA256": DIGEST.split(":", 1)[1]}
    prefixed = item(repository_prefix="team")
    assert prefixed["annotations"]["cloudstation.io/build-image"] == f"{REGISTRY_HOST}/team/shop/cart:{TAG}"


@pytest.mark.parametrize("bad", [
    dict(context_digest="sha256:abc"), dict(project="Shop"), dict(content_tag="a/b"),
    dict(registry_host="http://registry:5000"),
])
def test_bad_arguments_are_refused(bad):
    with pytest.raises(ValueError):
        item(**bad)


def test_no_credential_in_the_item(mocked):
    """The build Secret holds the credentials; the item only names it and mounts files."""
    job = item(bj.BuildSettings(egress=[MIRROR]))
    text = json.dumps(job)
    for secret in (PASSWORD, basic_auth(USERNAME, PASSWORD), base64.b64encode(PASSWORD.encode()).decode()):
        assert secret not in text
    spec = job["podSpec"]
    assert checks.secret_env_violations("b", spec) == []
    assert checks.argument_credential_violations("b", spec) == []
    assert checks.credential_value_violations("item", job) == []
    # Both containers read the credentials from the Secret's files, each only the key it needs.
    secrets = {v["name"]: v["secret"] for v in spec["volumes"] if "secret" in v}
    assert {s["secretName"] for s in secrets.values()} == {SECRET_NAME}
    assert [i["key"] for i in secrets["credentials"]["items"]] == [bj.AUTH_KEY]
    assert [i["key"] for i in secrets["docker-config"]["items"]] == [bj.DOCKERCONFIG_KEY]
    # The Secrets built by BuildsNamespace, one per project, hold exactly those keys, and each its
    # project's build user.
    objects = build_mocked(mocked, lambda: BuildsNamespace("builds", namespace_args()) and None)
    secrets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}
    assert sorted(secrets) == [build_secret_name("games"), SECRET_NAME]
    for secret in secrets.values():
        assert secret["type"] == "kubernetes.io/dockerconfigjson"
        assert set(secret["stringData"]) == {bj.AUTH_KEY, bj.DOCKERCONFIG_KEY}
    registrations = {r.inputs["metadata"]["name"]: r for r in mocked.registrations if r.type == "kubernetes:core/v1:Secret"}
    for project, password in (("shop", PASSWORD), ("games", "games-pw")):
        data = registrations[build_secret_name(project)].inputs["stringData"]["value"]
        assert base64.b64decode(data[bj.AUTH_KEY]).decode() == f"build-{project}:{password}"
        assert json.loads(data[bj.DOCKERCONFIG_KEY])["auths"][REGISTRY_HOST]["password"] == password


# --- settings --------------------------------------------------------------------------------------


@pytest.mark.parametrize("raw, key, fragment", [
    ({"image": "docker.io/martizih/kaniko:latest"}, "image", "pinned exactly"),
    ({"image": "martizih/kaniko:v1.28.3"}, "image", "registry host"),
    ({"timeoutSeconds": 10}, "timeoutSeconds", "greater than or equal to 60"),
    ({"cpu": "lots"}, "cpu", "CPU quantity"),
    ({"egress": [{"cidrs": ["0.0.0.0/0"]}]}, "egress.0.cidrs.0", "every address"),
    ({"egress": [{"hosts": ["registry.npmjs.org"]}]}, "egress.0", "registry.npmjs.org"),
    ({"egress": [{"ports": [443]}]}, "egress.0", "names no destination"),
    ({"egress": [{"cidrs": ["10.0.0.0/8"], "ports": []}]}, "egress.0.ports", "at least 1"),
    ({"registryMirrors": ["https://mirror.example.com"]}, "registryMirrors.0", "without a scheme"),
    ({"mirrors": []}, "mirrors", "Extra inputs"),
])
def test_bad_settings_name_the_key_and_what_is_allowed(raw, key, fragment):
    with pytest.raises(ValidationError) as caught:
        bj.BuildSettings.model_validate(raw)
    errors = caught.value.errors()
    assert any(".".join(map(str, e["loc"])) == key and fragment in e["msg"] for e in errors), errors


def test_defaults_open_no_egress():
    settings = bj.BuildSettings()
    assert settings.egress == [] and settings.registry_mirrors == []
    assert bj.BuildSettings.model_validate({"egress": [{"cidrs": ["10.1.0.0/16"], "ports": [8081]}]}).egress[0].peers() == [
        {"ipBlock": {"cidr": "10.1.0.0/16"}}]


# --- the namespace and its NetworkPolicies -----------------------------------------------------------


def namespace_args(settings: bj.BuildSettings | None = None) -> BuildsNamespaceArgs:
    return BuildsNamespaceArgs(namespace="cloudstation-builds", registry_host=REGISTRY_HOST,
                               registry_namespace="cloudstation", registry_pod_labels=REGISTRY_LABELS,
                               credentials={"shop": (USERNAME, PASSWORD), "games": ("build-games", "games-pw")},
                               settings=settings or bj.BuildSettings())


def allowed_flows(objects: list[dict]) -> set[tuple]:
    """(direction, peer as JSON, port, protocol) of every rule of every policy in the namespace."""
    flows = set()
    for policy in (o for o in objects if o["kind"] == "NetworkPolicy"):
        spec = policy["spec"]
        for direction, key in (("ingress", "from"), ("egress", "to")):
            for rule in spec.get(direction) or []:
                for peer in rule[key]:
                    for port in rule["ports"]:
                        flows.add((direction, json.dumps(peer, sort_keys=True), port["port"], port["protocol"]))
    return flows


@pytest.mark.parametrize("settings", [bj.BuildSettings(), bj.BuildSettings(egress=[MIRROR, NEXUS])],
                         ids=["defaults", "mirrors"])
def test_build_pods_reach_only_dns_the_registry_and_the_declared_mirrors(mocked, settings):
    objects = build_mocked(mocked, lambda: BuildsNamespace("builds", namespace_args(settings)) and None)
    assert validate.validate_all(objects) == []
    [namespace] = [o for o in objects if o["kind"] == "Namespace"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == bj.POD_SECURITY_LEVEL
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/warn"] == "restricted"
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    assert any(checks.is_default_deny(p) for p in policies)
    for policy in policies:
        assert checks.open_peer_violations(policy["metadata"]["name"], policy["spec"]) == []
    dns = json.dumps(network.pods(network.KUBE_DNS, namespace="kube-system"), sort_keys=True)
    registry = json.dumps(network.pods(REGISTRY_LABELS, namespace="cloudstation"), sort_keys=True)
    expected = {("egress", dns, 53, "UDP"), ("egress", dns, 53, "TCP"), ("egress", registry, 5000, "TCP")}
    for destination in settings.egress:
        expected |= {("egress", json.dumps(p, sort_keys=True), port, "TCP")
                     for p in destination.peers() for port in destination.ports}
    assert allowed_flows(objects) == expected
    # Nothing may connect to a build pod; the policies select Armada's pods (the executor's job label).
    selecting = [p for p in policies if not checks.is_default_deny(p) and not checks.allows_only_dns(p)]
    assert selecting and all(checks.selects(p["spec"]["podSelector"], {BUILD_POD_LABEL: "01abc"}) for p in selecting)
    assert all(not p["spec"].get("ingress") for p in policies)
    for _, peer, _, _ in allowed_flows(objects):
        cidr = json.loads(peer).get("ipBlock", {}).get("cidr")
        assert cidr is None or ipaddress.ip_network(cidr).prefixlen > 0


def test_the_component_registers_its_type_children_and_outputs(mocked):
    build_mocked(mocked, lambda: BuildsNamespace("builds", namespace_args()) and None)
    [component] = [r for r in mocked.registrations if r.type == "cloudstation:builds:BuildsNamespace"]
    children = [r for r in mocked.registrations if r.parent == component.urn]
    assert children and all(r.name.startswith("builds") for r in children)


# --- the fetch script against a real registry ------------------------------------------------------


def context_tar(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def upload_blob(registry, repository: str, blob: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(blob).hexdigest()
    base = f"http://{registry.host}/v2/{repository}/blobs/uploads/"
    started = requests.post(base, auth=registry.auth, timeout=10)
    assert started.status_code == 202, started.text
    location = started.headers["Location"]
    location = location if location.startswith("http") else f"http://{registry.host}{location}"
    done = requests.put(location, params={"digest": digest}, data=blob, auth=registry.auth, timeout=10,
                        headers={"Content-Type": "application/octet-stream"})
    assert done.status_code == 201, done.text
    return digest


def run_fetch(tmp_path, url: str, digest: str, auth: str) -> tuple[subprocess.CompletedProcess, object]:
    """The pod's fetch script with its three directories moved below tmp_path (GNU wget, tar and
    sha256sum take the same options as busybox's here)."""
    assert shutil.which("wget") and shutil.which("sha256sum"), "wget and sha256sum are required"
    dirs = {bj.CREDENTIALS_DIR: tmp_path / "credentials", bj.DOWNLOAD_DIR: tmp_path / "download",
            bj.WORKSPACE: tmp_path / "workspace"}
    script = bj.fetch_script()
    for original, moved in dirs.items():
        moved.mkdir(parents=True, exist_ok=True)
        script = script.replace(original, str(moved))
    (dirs[bj.CREDENTIALS_DIR] / bj.AUTH_KEY).write_text(auth)
    env = {"PATH": "/usr/bin:/bin", "CONTEXT_URL": url, "CONTEXT_SHA256": digest.split(":", 1)[1]}
    done = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    return done, dirs[bj.WORKSPACE]


def test_the_fetch_script_unpacks_the_blob_only_when_it_is_the_named_one(registry, tmp_path):
    files = {"Dockerfile": b"FROM scratch\n", "src/index.js": b"console.log(1)\n", "cart.proto": b"syntax = 'proto3';\n"}
    blob = context_tar(files)
    digest = upload_blob(registry, "builds/shop/cart", blob)
    url = bj.context_url(registry.host, "shop", "cart", digest)
    good = basic_auth(*registry.auth)

    done, workspace = run_fetch(tmp_path / "ok", url, digest, good)
    assert done.returncode == 0, done.stderr
    assert {p.relative_to(workspace).as_posix(): p.read_bytes() for p in workspace.rglob("*") if p.is_file()} == files
    assert not any((tmp_path / "ok" / "download").iterdir())

    other = "sha256:" + hashlib.sha256(b"something else").hexdigest()
    done, workspace = run_fetch(tmp_path / "digest", url, other, good)  # the URL's blob is not the named one
    assert done.returncode != 0 and not any(workspace.iterdir())

    done, workspace = run_fetch(tmp_path / "auth", url, digest, basic_auth(registry.auth[0], "wrong"))
    assert done.returncode != 0 and not any(workspace.iterdir())


# --- what the stacks render --------------------------------------------------------------------------


def test_every_rendered_build_job_runs_in_the_rendered_builds_namespace_at_its_level(rendered_stacks):
    """The job items the stacks render (the EntityBuild input the offline render shows) are valid
    Pods, relax exactly the documented controls, and name the builds namespace the stack renders
    (enforcing the builder's level) and its build Secret."""
    checked = 0
    for stack, rendered in rendered_stacks.items():
        objects = rendered.manifests()
        builds = [r for r in rendered.registrations if r.type.endswith("dynamic/builds:EntityBuild")]
        if not builds:
            continue
        [name] = {job_item_of(b.inputs)["namespace"] for b in builds}
        [namespace] = [o for o in objects if o["kind"] == "Namespace" and o["metadata"]["name"] == name]
        assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == bj.POD_SECURITY_LEVEL
        secrets = {o["metadata"]["name"] for o in objects if o["kind"] == "Secret" and o["metadata"].get("namespace") == name}
        for build in builds:
            job = job_item_of(build.inputs)
            assert job["namespace"] == name, stack
            spec = job["podSpec"]
            assert validate.validate_all([as_pod(job)]) == [], stack
            assert checks.baseline_violations(build.name, spec) == []
            assert sorted(p.split(": ", 1)[1] for p in checks.restricted_violations(build.name, spec)) == sorted([
                f"adds capabilities {sorted(bj.BUILDER_CAPABILITIES)}", "runAsNonRoot must be true", "runAsUser 0"])
            assert {v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v} <= secrets, stack
            assert checks.argument_credential_violations(build.name, spec) == []
            checked += 1
    assert checked, "no stack renders an in-cluster build (the test stack builds in armada mode)"
