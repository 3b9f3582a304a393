"""Scenario step 6 of issue 19: admission and authorization, for real (docs/security.md).

After step 1 (`pulumi up` of test, its first builds included; after every step of
e2e/test_scenario.py in a full run, prod deployed too), against the real API server: Pod Security
admission of every pod the controllers create, the ValidatingAdmissionPolicies the program creates
(type-checked and denying what the docs say, as the executor's ServiceAccount), and RBAC as the
authorizer answers `kubectl auth can-i` for every identity docs/security.md speaks of. Each
expectation comes from the program (its render, its config, its constants) or is written out next
to the sentence it checks; the cluster supplies only the answers.

What this tier cannot check, said here and not skipped anywhere: NetworkPolicies are accepted but
not enforced (no CNI); no container runs, so no process is seen finding (or not finding) a token;
Armada's own authorization is the fake's (tests/fake_armada.py), so the Armada users' queue rights
(the build user's `submit`, `cancel`, `watch`) are the unit tests' (tests/test_builds_program.py,
tests/test_armada_security.py); the CloudState operator does not reconcile under kwok, so its entity
pods are built here as its v0.6.0 source builds them; the example stacks deploy no Binoculars, so
its role is checked only as absent. docs/operations.md documents no least-privilege role for
`pulumi up` itself ("a dedicated ServiceAccount" with "the rights `pulumi up` needs"): only the
preview's read-only role and the build tunnel's rights are documented, and tested here.
"""
from __future__ import annotations

import contextlib
import copy
import json
import re
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Iterator, Optional

import pytest
import yaml

from components.armada.cluster import EXECUTOR_JOBS_ROLE, JOB_POLICY, service_account_user
from components.armada.config import BINOCULARS, SCHEDULER, executor_name
from components.build_job import RELAXED_RESTRICTED_CONTROLS
from components.cloudstate_operator import CONFIG_MAP as OPERATOR_CONFIG_MAP, NAME as OPERATOR
from components.cloudstate_operator import parse_operator_config
from e2e.platform import Platform
from e2e.standins import executor_pod
from infra.builds import build_queues, in_armada, registry_tunnel
from tests.fake_armada import Job

SCRATCH = "e2e-security"
"""A namespace of this module's own identities (the read-only previewer, the build submitters):
nothing of the program is in it, and it is deleted at the end."""
TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
PSA = "pod-security.kubernetes.io/"
READ = ("get", "list", "watch")


# --- the render, the config -------------------------------------------------------------------


@pytest.fixture(scope="module")
def rendered(platform: Platform) -> dict[str, list[dict]]:
    """Stack -> the objects `python -m infra render` writes for it in the copy: every stack the state
    backend holds resources of (test after step 1; prod too after step 3)."""
    stacks = json.loads(platform.pulumi("stack", "ls", "--json").check().stdout)
    found = {}
    for stack in sorted(s["name"] for s in stacks if s.get("resourceCount")):
        out = platform.work / "rendered" / stack
        platform.python("-m", "infra", "render", "--stack", stack, "--out", str(out)).check()
        found[stack] = [o for o in yaml.safe_load_all((out / "manifests.yaml").read_text()) if o]
    assert "test" in found, sorted(found)
    return found


def objects(rendered: dict[str, list[dict]], kind: str) -> list[dict]:
    return [o for objs in rendered.values() for o in objs if o["kind"] == kind]


def program_namespaces(rendered: dict[str, list[dict]]) -> list[str]:
    return sorted({o["metadata"]["name"] for o in objects(rendered, "Namespace")})


@pytest.fixture(scope="module")
def scratch(platform: Platform) -> Iterator[str]:
    platform.cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SCRATCH}})
    yield SCRATCH
    platform.cluster.kubectl("delete", "namespace", SCRATCH, "--wait=false", check=False)


# --- identities and what the authorizer answers for them --------------------------------------


Identity = tuple[str, tuple[str, ...]]


def account(namespace: str, name: str) -> Identity:
    """A ServiceAccount as the API server authenticates its token: the user and its three groups
    (kubernetes staging/src/k8s.io/apiserver/pkg/authentication/serviceaccount/util.go MakeGroupNames)."""
    return (service_account_user(namespace, name),
            ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"))


NOBODY = account("e2e-nobody", "nobody")
"""An account of a namespace that does not exist: what Kubernetes gives every service account of
every namespace, and nothing the platform grants. Subtracted from every identity's list."""
BASELINE_MAY_HAVE = {
    # kubernetes plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go: system:basic-user,
    # system:discovery and system:public-info-viewer for system:authenticated,
    # system:service-account-issuer-discovery and system:cluster-trust-bundle-discovery for
    # system:serviceaccounts.
    "selfsubjectreviews.authentication.k8s.io": {"create"},
    "selfsubjectaccessreviews.authorization.k8s.io": {"create"},
    "selfsubjectrulesreviews.authorization.k8s.io": {"create"},
    "clustertrustbundles.certificates.k8s.io": set(READ),
}

Rule = tuple[str, str, str]
"""(resource, or a non-resource URL; resource name or ""; verb)"""


def rules(*entries: tuple) -> set[Rule]:
    """(resources, verbs[, resource names]) entries as `kubectl auth can-i --list` rows, expanded."""
    found = set()
    for resources, verbs, *names in entries:
        for resource in resources:
            for verb in verbs:
                for name in (names[0] if names else [""]):
                    found.add((resource, name, verb))
    return found


def can_i_list(platform: Platform, identity: Identity, namespace: str) -> set[Rule]:
    """`kubectl auth can-i --list -n <namespace> --as ...` (a SelfSubjectRulesReview: the rules of
    every RoleBinding in the namespace and every ClusterRoleBinding), one row per resource, name
    and verb. The table's columns start where its header's do (kubectl prints with a tabwriter)."""
    result = platform.cluster.kubectl("auth", "can-i", "--list", "-n", namespace, as_user=identity[0],
                                      as_groups=identity[1])
    lines = result.stdout.splitlines()
    header = lines[0]
    starts = [header.index(title) for title in ("Resources", "Non-Resource URLs", "Resource Names", "Verbs")]
    found = set()
    for line in lines[1:]:
        resource, urls, names, verbs = (line[a:b].strip() for a, b in zip(starts, [*starts[1:], None]))
        for what in ([resource] if resource else urls.strip("[]").split()):
            for name in (names.strip("[]").split() or [""]):
                for verb in verbs.strip("[]").split():
                    found.add((what, name, verb))
    return found


@pytest.fixture(scope="module")
def baseline(platform: Platform) -> set[Rule]:
    found = can_i_list(platform, NOBODY, "default")
    # Nothing beyond Kubernetes' own defaults: with a broader baseline (someone bound a role to all
    # service accounts), every comparison below would pass for the wrong reason.
    beyond = {r for r in found if not r[0].startswith("/") and r[2] not in BASELINE_MAY_HAVE.get(r[0], ())}
    beyond |= {r for r in found if r[0].startswith("/") and r[2] != "get"}
    assert not beyond, f"every service account may do more than Kubernetes' defaults: {sorted(beyond)}"
    return found


def granted(platform: Platform, baseline: set[Rule], identity: Identity, namespace: str) -> set[Rule]:
    """What `identity` may do in `namespace` beyond what every service account may."""
    return can_i_list(platform, identity, namespace) - baseline


def can_i(platform: Platform, identity: Identity, verb: str, resource: str, namespace: Optional[str] = None,
          subresource: Optional[str] = None) -> bool:
    args = ["auth", "can-i", verb, resource, *(["-n", namespace] if namespace else []),
            *([f"--subresource={subresource}"] if subresource else [])]
    answer = platform.cluster.kubectl(*args, as_user=identity[0], as_groups=identity[1], check=False)
    assert answer.stdout.strip() in ("yes", "no"), answer.stderr
    return answer.stdout.strip() == "yes"


def wait_until(what: str, condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not after {timeout:.0f} s: {what}")
        time.sleep(0.5)


def executors(platform: Platform) -> list[Identity]:
    armada = platform.config("test").platform.armada
    return [account(armada.namespace, executor_name(e)) for e in armada.executors]


def job_namespaces(platform: Platform) -> list[str]:
    """Where the executors may write: `armada.jobNamespaces`, and the builds namespace, which
    infra/builds.py makes one more job namespace."""
    config = platform.config("test")
    return [*config.platform.armada.job_namespaces, *([config.platform.builds_namespace] if in_armada(config) else [])]


@contextlib.contextmanager
def applied(platform: Platform, *manifests: dict) -> Iterator[None]:
    """Objects created as the admin for the length of a check, deleted after it."""
    if manifests:
        platform.cluster.apply(list(manifests))
    try:
        yield
    finally:
        for manifest in reversed(manifests):
            namespace = manifest["metadata"].get("namespace")
            platform.cluster.kubectl("delete", manifest["kind"], manifest["metadata"]["name"],
                                     *(["-n", namespace] if namespace else []), "--wait=false", "--ignore-not-found",
                                     check=False)


def token_kubeconfig(platform: Platform, namespace: str, name: str, path: Path) -> Path:
    """A kubeconfig that authenticates as ServiceAccount `namespace/name` with a bound token
    (TokenRequest, `kubectl create token`), as a CI runner's would."""
    token = platform.cluster.kubectl("create", "token", name, "-n", namespace, "--duration=1h").stdout.strip()
    config = json.loads(platform.cluster.kubeconfig.read_text())
    config["users"] = [{"name": name, "user": {"token": token}}]
    config["contexts"] = [{"name": "e2e", "context": {"cluster": "e2e", "user": name}}]
    path.write_text(json.dumps(config))
    return path


# --- Pod Security admission ---------------------------------------------------------------------


def psa_reasons(stderr: str) -> dict[str, str]:
    """The checks a `would violate PodSecurity "restricted:latest": a (…), b (…)` warning names,
    with their details (pod-security-admission admission/admission.go; one check per reason)."""
    found = re.search(r'would violate PodSecurity "[^"]+": (.*)', stderr)
    if not found:
        return {}
    reasons, depth, current = {}, 0, ""
    for char in found[1] + ", ":
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            reason, _, detail = current.strip().partition(" (")
            reasons[reason] = detail.rstrip(")")
            current = ""
            continue
        current += char
    return reasons


def psa_containers(reasons: dict[str, str]) -> set[str]:
    """The containers the details name: `container "a" must ...`, `containers "a", "b" must ...`."""
    lists = re.findall(r'containers? ((?:"[^"]+"(?:, )?)+)', " ".join(reasons.values()))
    return {name for found in lists for name in re.findall(r'"([^"]+)"', found)}


def dry_run(platform: Platform, obj: dict, identity: Optional[Identity] = None):
    """`kubectl create --dry-run=server`: the whole admission chain and the authorizer run, nothing
    is stored (kubernetes staging/src/k8s.io/apiserver/pkg/endpoints/handlers/create.go)."""
    return platform.cluster.kubectl("create", "--dry-run=server", "-f", "-", "-o", "json", input=json.dumps(obj),
                                    check=False, as_user=identity[0] if identity else None,
                                    as_groups=identity[1] if identity else ())


@pytest.mark.after("test_1_preview_and_up_test")
def test_namespaces_enforce_the_documented_pod_security_levels(platform: Platform, rendered):
    """docs/security.md "Pod Security": "The platform namespace ... enforces `restricted`", each
    entity namespace "(baseline enforced, restricted warned and audited)"; docs/builds.md: "The
    builds namespace enforces **baseline**"; docs/armada.md: job namespaces at
    `jobNamespacePodSecurity`, every other pod restricted. The render says so, and the live
    namespaces carry the rendered labels."""
    config = platform.config("test")
    armada = config.platform.armada
    for namespace in objects(rendered, "Namespace"):
        name, labels = namespace["metadata"]["name"], namespace["metadata"]["labels"]
        if "cloudstation.io/project" in labels:  # an entity namespace (components/project_environment.py)
            enforce = "baseline"
        elif name == config.platform.builds_namespace and in_armada(config):
            enforce = "baseline"
        elif name in armada.job_namespaces:
            enforce = armada.job_namespace_pod_security
        else:
            enforce = "restricted"
        expected = {f"{PSA}enforce": enforce, f"{PSA}warn": "restricted", f"{PSA}audit": "restricted"}
        assert {k: v for k, v in labels.items() if k.startswith(PSA)} == expected, name
        live = platform.cluster.api("GET", f"/api/v1/namespaces/{name}")
        assert live is not None, name
        assert {k: v for k, v in live["metadata"].get("labels", {}).items() if k.startswith(PSA)} == expected, name


@pytest.mark.after("test_1_preview_and_up_test")
def test_every_pod_the_controllers_create_is_admitted(platform: Platform):
    """Issue 19 step 6: no FailedCreate event anywhere (a pod refused by Pod Security admission, a
    quota or a policy is one on its ReplicaSet, StatefulSet or Job: kubernetes
    pkg/controller/controller_utils.go FailedCreatePodReason), and every such controller has the
    pods it asks for; the executor's build pods were admitted too (e2e/standins.py ClusterExecutor)."""
    def missing() -> list[str]:
        pods = platform.cluster.api("GET", "/api/v1/pods")["items"]
        owned = Counter(ref["uid"] for pod in pods if not pod["metadata"].get("deletionTimestamp")
                        for ref in pod["metadata"].get("ownerReferences", []) if ref.get("controller"))
        found = []
        for path, kind in (("/apis/apps/v1/replicasets", "ReplicaSet"), ("/apis/apps/v1/statefulsets", "StatefulSet")):
            for owner in platform.cluster.api("GET", path)["items"]:  # list items carry no kind
                want = owner["spec"].get("replicas", 1)
                if owned[owner["metadata"]["uid"]] != want:
                    found.append(f"{kind} {owner['metadata']['namespace']}/{owner['metadata']['name']}: "
                                 f"{owned[owner['metadata']['uid']]} of {want} pods")
        for job in platform.cluster.api("GET", "/apis/batch/v1/jobs")["items"]:
            if not owned[job["metadata"]["uid"]]:
                found.append(f"Job {job['metadata']['namespace']}/{job['metadata']['name']}: no pod")
        return found
    with contextlib.suppress(AssertionError):  # controllers of the last `pulumi up` may still be at work
        wait_until("every controller has its pods", lambda: not missing(), timeout=60)
    assert not missing()
    events = platform.cluster.api("GET", "/api/v1/events")["items"]
    refused = [f"{e['involvedObject']['kind']} {e['metadata']['namespace']}/{e['involvedObject']['name']}: "
               f"{e.get('message', '')}" for e in events if e.get("reason") == "FailedCreate"]
    assert not refused, "\n".join(refused)
    assert platform.executor.created, "no build pod was created through the API server"
    assert not platform.executor.refusals, platform.executor.refusals


def pod_templates(platform: Platform, namespaces: list[str]) -> list[tuple[str, dict]]:
    """(owner, pod) for the pod template of every controller in `namespaces`, as a Pod its controller
    would create (a StatefulSet's claim templates as the claims of its pod 0)."""
    found = []
    for path, kind in (("/apis/apps/v1/deployments", "Deployment"), ("/apis/apps/v1/statefulsets", "StatefulSet"),
                       ("/apis/apps/v1/daemonsets", "DaemonSet"), ("/apis/batch/v1/jobs", "Job"),
                       ("/apis/batch/v1/cronjobs", "CronJob")):
        for owner in platform.cluster.api("GET", path)["items"]:
            namespace, name = owner["metadata"]["namespace"], owner["metadata"]["name"]
            if namespace not in namespaces:
                continue
            template = owner["spec"]["jobTemplate"]["spec"]["template"] if kind == "CronJob" else owner["spec"]["template"]
            spec = copy.deepcopy(template["spec"])
            for claim in owner["spec"].get("volumeClaimTemplates", []):
                spec.setdefault("volumes", []).append({"name": claim["metadata"]["name"], "persistentVolumeClaim": {
                    "claimName": f"{claim['metadata']['name']}-{name}-0"}})
            found.append((f"{kind} {namespace}/{name}", {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"generateName": "e2e-security-", "namespace": namespace,
                             "labels": (template.get("metadata") or {}).get("labels", {})},
                "spec": spec}))
    return found


@pytest.mark.after("test_1_preview_and_up_test")
def test_every_workload_meets_restricted(platform: Platform, rendered):
    """docs/security.md: "Every workload meets Pod Security "restricted" except the operator-made
    entity pods (baseline, see below), Armada jobs (their namespaces' `jobNamespacePodSecurity`) and
    the entity builds" (docs/armada.md: "Every pod meets the restricted Pod Security Standard"). Every controller's pod, the Jobs a CronJob has not run yet
    included, admitted without a restricted warning: every namespace of the program enforces or
    warns restricted (test above), so Pod Security admission names any violation. The exceptions
    are the next tests'."""
    templates = pod_templates(platform, program_namespaces(rendered))
    assert templates
    violations = {}
    for owner, pod in templates:
        answer = dry_run(platform, pod)
        assert answer.returncode == 0, f"{owner}: {answer.stderr}"
        if psa_reasons(answer.stderr):
            violations[owner] = psa_reasons(answer.stderr)
    assert not violations, violations


def violating_pods() -> dict[str, dict]:
    """A pod meeting restricted, one meeting only baseline (no securityContext at all) and one meeting
    neither (privileged): pod-security-admission policy/check_privileged.go, check_runAsNonRoot.go."""
    restricted = {"securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
                  "containers": [{"name": "probe", "image": "busybox:1.38.0",
                                  "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]}
    baseline = {"containers": [{"name": "probe", "image": "busybox:1.38.0"}]}
    privileged = {"containers": [{"name": "probe", "image": "busybox:1.38.0", "securityContext": {"privileged": True}}]}
    return {"restricted": restricted, "baseline": baseline, "privileged": privileged}


@pytest.mark.after("test_1_preview_and_up_test")
def test_each_namespace_refuses_what_its_level_forbids(platform: Platform, rendered):
    """The control of the two tests above (Pod Security admission is on, and the labels are what it
    enforces): in each namespace of the program, a pod below its rendered `enforce` level is refused
    naming that level, a pod at it admitted."""
    order = ["privileged", "baseline", "restricted"]
    for namespace in objects(rendered, "Namespace"):
        name, level = namespace["metadata"]["name"], namespace["metadata"]["labels"][f"{PSA}enforce"]
        for meets, spec in violating_pods().items():
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "e2e-security-", "namespace": name},
                   "spec": spec}
            answer = dry_run(platform, pod)
            if order.index(meets) >= order.index(level):
                assert answer.returncode == 0, f"{name} ({level}) refused a {meets} pod: {answer.stderr}"
            else:
                assert answer.returncode != 0, f"{name} ({level}) admitted a {meets} pod"
                assert f'violates PodSecurity "{level}:latest"' in answer.stderr, answer.stderr


def build_job(platform: Platform) -> Job:
    """A build job `pulumi up` submitted (step 1), as the fake Armada holds it: its item is the
    program's (components/build_job.py)."""
    builds = platform.config("test").platform.builds_namespace
    found = [j for j in platform.armada.jobs.values() if j.item.get("namespace") == builds]
    assert found, "pulumi up submitted no build job"
    return found[0]


def fresh(job: Job, **item) -> Job:
    """The same job under a new id (so its pod has a name of its own), its item changed by `item`."""
    return Job(id=f"01e2e{uuid.uuid4().hex[:21]}", queue=item.pop("queue", job.queue), job_set_id=job.job_set_id,
               item={**copy.deepcopy(job.item), **item}, owner=job.owner, created=time.time())


PSA_CHECK = {"runAsNonRoot": "runAsNonRoot != true", "runAsUser": "runAsUser=0", "capabilities": "unrestricted capabilities"}
"""components/build_job.py RELAXED_RESTRICTED_CONTROLS -> the reason pod-security-admission gives
(policy/check_runAsNonRoot.go, check_runAsUser.go, check_capabilities_restricted.go)."""


@pytest.mark.after("test_1_preview_and_up_test")
def test_build_pods_need_baseline_and_relax_only_what_kaniko_needs(platform: Platform):
    """docs/builds.md "Builder": the builds namespace enforces baseline because kaniko runs as root
    with file capabilities ("restricted" refuses both), the fetch container meets restricted. The
    pod Armada's executor creates for a real build job, as the executor: admitted, and restricted's
    warning names only the build container and only the relaxed controls (with `hostUsers: false`,
    policy v1.35 and later no longer count uid 0: capabilities at every version)."""
    executor = executors(platform)[0]
    job = fresh(build_job(platform))
    answer = dry_run(platform, executor_pod(job, str(uuid.uuid4())), executor)
    assert answer.returncode == 0, answer.stderr
    reasons = psa_reasons(answer.stderr)
    assert PSA_CHECK["capabilities"] in reasons, answer.stderr
    assert set(reasons) <= {PSA_CHECK[c] for c in RELAXED_RESTRICTED_CONTROLS}, reasons
    assert psa_containers(reasons) == {"build"}, reasons


def operator_pod(service: dict, proxy_image: str, namespace: str) -> dict:
    """The pod of the Deployment CloudState operator 0.6.0 makes of a StatefulService
    (operator/src/main/scala/io/cloudstate/operator/StatefulServiceOperatorFactory.scala
    `createDeployment`, `createSideCar`; docs/cloudstate.md "What the operator makes of a
    StatefulService"): the first container renamed `user-container` with its first port, `PORT` and
    a `/var/log` emptyDir, its securityContext without `seccompProfile` (skuber 2.4.0 has no such
    field: docs/cloudstate.md hazard 3), and the sidecar `akka-sidecar` with no securityContext; no
    pod securityContext; the StatefulService's volumes and serviceAccountName."""
    spec = service["spec"]
    user = copy.deepcopy(spec["containers"][0])
    port = (user.get("ports") or [{"containerPort": 8080}])[0]["containerPort"]
    user.update(name="user-container", ports=[{"name": "user-port", "containerPort": port}],
                env=[*user.get("env", []), {"name": "PORT", "value": str(port)}],
                volumeMounts=[*user.get("volumeMounts", []), {"name": "varlog", "mountPath": "/var/log"}])
    if "securityContext" in user:
        user["securityContext"] = {k: v for k, v in user["securityContext"].items() if k != "seccompProfile"}
    sidecar = {"name": "akka-sidecar", "image": proxy_image, "ports": [{"name": "grpc-proxy", "containerPort": 8013}],
               "env": [{"name": "HTTP_PORT", "value": "8013"}, {"name": "USER_FUNCTION_PORT", "value": str(port)},
                       {"name": "JAVA_OPTS", "value": f"-Xms{spec.get('sidecarJvmMemory', '256m')} "
                                                      f"-Xmx{spec.get('sidecarJvmMemory', '256m')}"}],
               "resources": spec.get("sidecarResources", {})}
    name = service["metadata"]["name"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": f"{name}-deployment-", "namespace": namespace,
                         "labels": {"cloudstate.io/statefulService": name, "app": name}},
            "spec": {"containers": [user, sidecar], "volumes": [*spec.get("volumes", []), {"name": "varlog", "emptyDir": {}}],
                     "serviceAccountName": spec.get("serviceAccountName", "")}}


@pytest.mark.after("test_1_preview_and_up_test")
def test_operator_made_entity_pods_need_baseline_and_the_user_function_gets_no_token(platform: Platform, rendered):
    """docs/security.md "Pod Security": "The operator generates the entity pods without a
    securityContext, which only `baseline` admits, so no entity runs there [the restricted platform
    namespace]"; "No API token where nothing calls the API": "the user-function container ... mounts
    an empty directory over the token's path, which the ServiceAccount admission plugin respects, so a
    compromised user function finds no token" (kubernetes plugin/pkg/admission/serviceaccount/
    admission.go). Each StatefulService of the render, as the operator's pod, in its namespace."""
    config_maps = [o for o in objects(rendered, "ConfigMap") if o["metadata"]["name"] == OPERATOR_CONFIG_MAP]
    assert config_maps, "no operator ConfigMap rendered"
    proxy = parse_operator_config(config_maps[0]["data"]["config"])["proxy.image"]["no-store"]  # any: admission reads no image
    services = objects(rendered, "StatefulService")
    assert services
    restricted_namespace = platform.config("test").platform.namespace
    for service in services:
        namespace = service["metadata"]["namespace"]
        answer = dry_run(platform, operator_pod(service, proxy, namespace))
        assert answer.returncode == 0, f"{namespace}/{service['metadata']['name']}: {answer.stderr}"
        assert "akka-sidecar" in psa_containers(psa_reasons(answer.stderr)), answer.stderr
        admitted = json.loads(answer.stdout)
        mounts = {c["name"]: [m for m in c.get("volumeMounts", []) if m["mountPath"] == TOKEN_PATH]
                  for c in admitted["spec"]["containers"]}
        volumes = {v["name"]: v for v in admitted["spec"]["volumes"]}
        tokens = {name for name, v in volumes.items()
                  if any("serviceAccountToken" in s for s in v.get("projected", {}).get("sources", []))}
        assert tokens, "the entity pod got no token: its proxy needs one"
        assert [m["name"] for m in mounts["akka-sidecar"]] == sorted(tokens)
        assert mounts["user-container"] and not {m["name"] for m in mounts["user-container"]} & tokens, mounts
        assert all("emptyDir" in volumes[m["name"]] for m in mounts["user-container"])
        # "restricted would reject every entity pod" (docs/cloudstate.md): the same pod where restricted
        # is enforced (as `default`: the entities' account exists only in their namespaces).
        elsewhere = operator_pod(service, proxy, restricted_namespace)
        elsewhere["spec"]["serviceAccountName"] = "default"
        refused = dry_run(platform, elsewhere)
        assert refused.returncode != 0 and 'violates PodSecurity "restricted:latest"' in refused.stderr, refused.stderr


# --- ValidatingAdmissionPolicies ------------------------------------------------------------------


@pytest.mark.after("test_1_preview_and_up_test")
def test_admission_policies_type_check_without_warnings(platform: Platform, rendered):
    """Issue 19 step 6: every ValidatingAdmissionPolicy the program creates is accepted with no
    type-checking warnings. The API server's policy status controller type-checks each validation
    against every kind the policy matches and writes the result with `status.observedGeneration`
    (kubernetes pkg/controller/validatingadmissionpolicystatus, staging/src/k8s.io/apiserver/pkg/
    admission/plugin/policy/validating/typechecking.go). Its bindings exist as rendered."""
    policies = objects(rendered, "ValidatingAdmissionPolicy")
    assert policies
    for name in sorted({p["metadata"]["name"] for p in policies}):
        path = f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{name}"

        def checked() -> bool:
            live = platform.cluster.api("GET", path)
            return live is not None and live.get("status", {}).get("observedGeneration") == live["metadata"]["generation"]
        wait_until(f"policy {name} type-checked", checked)
        status = platform.cluster.api("GET", path)["status"]
        assert not (status.get("typeChecking") or {}).get("expressionWarnings"), \
            "\n".join(w["fieldRef"] + ": " + w["warning"] for w in status["typeChecking"]["expressionWarnings"])
    for binding in objects(rendered, "ValidatingAdmissionPolicyBinding"):
        live = platform.cluster.api(
            "GET", f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/{binding['metadata']['name']}")
        assert live is not None, binding["metadata"]["name"]
        assert (live["spec"]["policyName"], live["spec"]["validationActions"]) == \
            (binding["spec"]["policyName"], binding["spec"]["validationActions"])


def job_policy(rendered) -> tuple[dict, str]:
    """The rendered job policy and the name of its binding (the refusal names both)."""
    policy = next(p for p in objects(rendered, "ValidatingAdmissionPolicy") if p["metadata"]["name"] == JOB_POLICY)
    binding = next(b["metadata"]["name"] for b in objects(rendered, "ValidatingAdmissionPolicyBinding")
                   if b["spec"]["policyName"] == JOB_POLICY)
    return policy, binding


RULE_MARK = {"namespace": "Armada executors may only create objects in the job namespaces",
             "account": "Armada job pods run as the service account", "labels": "Armada jobs may not carry the platform's own labels",
             "queue": "only jobs of the build queues", "user-namespace": "must run in their own user namespace",
             "registry-image": "Armada jobs may not run images of the platform registry"}
"""Which of the job policy's validations a case breaks, by what its rendered message says
(components/armada/cluster.py job_policy_validations)."""


def refusal(rendered, rule: str) -> str:
    """The API server's message for a request the job policy denies by `rule` (kubernetes
    staging/src/k8s.io/apiserver/pkg/admission/plugin/policy/validating/dispatcher.go: the first
    failing validation's message)."""
    policy, binding = job_policy(rendered)
    [message] = [v["message"] for v in policy["spec"]["validations"] if RULE_MARK[rule] in v["message"]]
    return f"ValidatingAdmissionPolicy '{JOB_POLICY}' with binding '{binding}' denied request: {message}"


RESTRICTED_JOB = violating_pods()["restricted"]
"""A job's pod spec that meets restricted: Pod Security admission, which runs before the policy
(kube-apiserver's plugin order, pkg/kubeapiserver/options/plugins.go), admits it anywhere."""


def job(namespace: str, queue: str = "research", labels: Optional[dict] = None, spec: Optional[dict] = None) -> Job:
    return Job(id=f"01e2e{uuid.uuid4().hex[:21]}", queue=queue, job_set_id="e2e-security",
               item={"namespace": namespace, "priority": 1, "labels": labels or {}, "podSpec": copy.deepcopy(spec or RESTRICTED_JOB)},
               owner="e2e", created=time.time())


def service(namespace: str, labels: Optional[dict] = None) -> dict:
    """A Service shaped like a job's (the job's labels, a selector on its pod)."""
    job_id = f"01e2e{uuid.uuid4().hex[:21]}"
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": f"armada-{job_id}-0-service-0", "namespace": namespace,
                         "labels": {"armada_job_id": job_id, "armada_queue_id": "research", **(labels or {})}},
            "spec": {"ports": [{"port": 8080}], "selector": {"armada_job_id": job_id}}}


def ingress(namespace: str) -> dict:
    job_id = f"01e2e{uuid.uuid4().hex[:21]}"
    return {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": f"armada-{job_id}-0-ingress-0", "namespace": namespace,
                         "labels": {"armada_job_id": job_id, "armada_queue_id": "research"}},
            "spec": {"defaultBackend": {"service": {"name": f"armada-{job_id}-0-service-0", "port": {"number": 8080}}}}}


def pod(job_: Job) -> dict:
    return executor_pod(job_, str(uuid.uuid4()))


OTHER_ACCOUNT = "e2e-other"
"""A ServiceAccount the denial cases create in a job namespace: the ServiceAccount admission plugin
(mutating, before the policy) refuses a pod naming an account that does not exist."""


def denial_cases(platform: Platform) -> dict[str, tuple[dict, str, bool]]:
    """Case -> (object, the rule it breaks, whether the executor needs a write grant there first).
    docs/security.md "Jobs cannot leave their namespaces or borrow identities": the policy
    "refuses whatever an executor's service account creates or updates outside the job namespaces,
    a pod running as any account but `jobServiceAccount` (granted nothing), and the platform's own
    labels"; docs/builds.md: in the builds namespace "a pod there must carry the executor-set label
    `armada_queue_id` naming a build queue", "only there may a job carry the build labels", and with
    `userNamespace: true` "a pod there must have `hostUsers: false`"; docs/security.md: a job names no
    image of the platform registry (the nodes' cache would serve it without a credential); docs/armada.md: it applies to
    "pods, services, ingresses" and "also holds if someone grants them more"."""
    config = platform.config("test")
    platform_ns, armada_ns = config.platform.namespace, config.platform.armada.namespace
    jobs_ns = config.platform.armada.job_namespaces[0]
    build = build_job(platform)
    other_queues = [q.name for q in config.platform.armada.queues if q.name not in build_queues(config)]
    cases = {
        "pod-in-the-platform-namespace": (pod(job(platform_ns)), "namespace", True),
        "pod-in-kube-system": (pod(job("kube-system")), "namespace", True),
        "service-in-the-armada-namespace": (service(armada_ns), "namespace", True),
        "ingress-in-the-platform-namespace": (ingress(platform_ns), "namespace", True),
        "pod-as-another-account": (pod(job(jobs_ns, spec={**RESTRICTED_JOB, "serviceAccountName": OTHER_ACCOUNT})),
                                   "account", False),
        "build-pod-as-another-account": (pod(fresh(build, podSpec={**build.pod_spec, "serviceAccountName": OTHER_ACCOUNT})),
                                         "account", False),
        "pod-part-of-the-platform": (pod(job(jobs_ns, labels={"app.kubernetes.io/part-of": "cloudstation"})), "labels", False),
        "pod-with-a-build-label-outside-the-builds-namespace": (
            pod(job(jobs_ns, labels={"cloudstation.io/entity": "cart"})), "labels", False),
        "pod-with-a-platform-subdomain-label": (
            pod(job(jobs_ns, labels={"armada.cloudstation.io/scheduler-client": "true"})), "labels", False),
        "service-with-a-platform-label": (service(jobs_ns, {"app.kubernetes.io/part-of": "cloudstation"}), "labels", False),
        "build-pod-of-another-queue": (pod(fresh(build, queue=(other_queues or ["e2e-no-build-queue"])[0])), "queue", False),
        # Issue 20 re-review: a node's cached copy of another project's image, run without a credential.
        "pod-with-a-platform-registry-image": (pod(job(jobs_ns, spec={**RESTRICTED_JOB, "containers": [
            {**container, "image": f"localhost:{config.platform.registry.node_port}/shop/cart@sha256:{'ab' * 32}",
             "imagePullPolicy": "IfNotPresent"} for container in RESTRICTED_JOB["containers"]]})), "registry-image", False),
    }
    if config.platform.builds.user_namespace:
        without = {k: v for k, v in build.pod_spec.items() if k != "hostUsers"}
        cases["build-pod-without-its-own-user-namespace"] = (pod(fresh(build, podSpec=without)), "user-namespace", False)
    return cases


DENIALS = ["pod-in-the-platform-namespace", "pod-in-kube-system", "service-in-the-armada-namespace",
           "ingress-in-the-platform-namespace", "pod-as-another-account", "build-pod-as-another-account",
           "pod-part-of-the-platform", "pod-with-a-build-label-outside-the-builds-namespace",
           "pod-with-a-platform-subdomain-label", "service-with-a-platform-label", "build-pod-of-another-queue",
           "build-pod-without-its-own-user-namespace", "pod-with-a-platform-registry-image"]


def resource_of(obj: dict) -> str:
    return {"Pod": "pods", "Service": "services", "Ingress": "ingresses.networking.k8s.io"}[obj["kind"]]


def create_as(platform: Platform, identity: Identity, obj: dict):
    """`kubectl create` as `identity`; whatever it created is deleted again (as the admin)."""
    answer = platform.cluster.kubectl("create", "-f", "-", "-o", "name", input=json.dumps(obj), check=False,
                                      as_user=identity[0], as_groups=identity[1])
    if answer.returncode == 0:
        platform.cluster.kubectl("delete", obj["kind"], obj["metadata"]["name"], "-n", obj["metadata"]["namespace"],
                                 "--wait=false", check=False)
    return answer


@pytest.mark.after("test_1_preview_and_up_test")
@pytest.mark.parametrize("case", DENIALS)
def test_the_job_policy_denies_the_executor(platform: Platform, rendered, case: str):
    """Each denial the docs claim (`denial_cases`), created as each executor's ServiceAccount: refused
    by the job policy with the message of the rule it breaks. Where RBAC already refuses the
    executor (outside the job namespaces), it is first seen to refuse, then a RoleBinding of the
    executors' job role grants the write there for the length of the case."""
    cases = denial_cases(platform)
    if case not in cases:  # build-pod-without-its-own-user-namespace, with platform.builds.userNamespace: false
        assert case == "build-pod-without-its-own-user-namespace" and not platform.config("test").platform.builds.user_namespace
        return
    obj, rule, needs_grant = cases[case]
    namespace = obj["metadata"]["namespace"]
    for executor in executors(platform):
        setup = [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": OTHER_ACCOUNT, "namespace": namespace}}
                 ] if rule == "account" else []
        if needs_grant:
            refused = create_as(platform, executor, obj)
            assert refused.returncode != 0 and f'cannot create resource "{resource_of(obj).split(".")[0]}"' in refused.stderr, \
                refused.stderr
            user = executor[0].split(":")
            setup.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                          "metadata": {"name": "e2e-security-executor-writes", "namespace": namespace},
                          "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": EXECUTOR_JOBS_ROLE},
                          "subjects": [{"kind": "ServiceAccount", "name": user[3], "namespace": user[2]}]})
        with applied(platform, *setup):
            wait_until(f"{executor[0]} may create {resource_of(obj)} in {namespace}",
                       lambda: can_i(platform, executor, "create", resource_of(obj), namespace))
            answer = create_as(platform, executor, obj)
        assert answer.returncode != 0, f"{case}: admitted ({answer.stdout.strip()})"
        assert refusal(rendered, rule) in answer.stderr, answer.stderr


@pytest.mark.after("test_1_preview_and_up_test")
def test_the_job_policy_admits_what_the_executor_must_create_and_denies_updates(platform: Platform, rendered):
    """The controls of the denials: the pod Armada's executor creates for a real build job (the
    program's job item) in the builds namespace, a job's pod and Service in a job namespace, are
    admitted as the executor; the admin may create what the executor may not (the policy applies
    to the executors only: its matchCondition). Then "creates or updates": patching the admitted job
    pod to carry a platform label is denied."""
    config = platform.config("test")
    jobs_ns = config.platform.armada.job_namespaces[0]
    for executor in executors(platform):
        build = pod(fresh(build_job(platform)))
        created = create_as(platform, executor, build)
        assert created.returncode == 0, created.stderr
        assert create_as(platform, executor, service(jobs_ns)).returncode == 0
        forbidden = pod(job(jobs_ns, labels={"app.kubernetes.io/part-of": "cloudstation"}))
        assert dry_run(platform, forbidden).returncode == 0, "the admin was refused: the policy is not the executors' only"
        admitted = pod(job(jobs_ns))
        answer = platform.cluster.kubectl("create", "-f", "-", "-o", "name", input=json.dumps(admitted), check=False,
                                          as_user=executor[0], as_groups=executor[1])
        assert answer.returncode == 0, answer.stderr
        try:
            patched = platform.cluster.kubectl(
                "patch", "pod", admitted["metadata"]["name"], "-n", jobs_ns, "--type=merge",
                "-p", json.dumps({"metadata": {"labels": {"app.kubernetes.io/part-of": "cloudstation"}}}),
                check=False, as_user=executor[0], as_groups=executor[1])
            assert patched.returncode != 0, "the executor gave a job pod the platform's label"
            assert refusal(rendered, "labels") in patched.stderr, patched.stderr
        finally:
            platform.cluster.kubectl("delete", "pod", admitted["metadata"]["name"], "-n", jobs_ns, "--wait=false",
                                     check=False)


# --- RBAC ---------------------------------------------------------------------------------------

EXECUTOR_READS = rules((("pods", "events", "nodes", "services", "ingresses.networking.k8s.io",
                         "endpointslices.discovery.k8s.io"), READ))
"""docs/security.md: "Cluster-wide, the executor may only get, list and watch pods, events, nodes,
services, ingresses and endpointslices"."""
EXECUTOR_WRITES = rules((("pods",), ("create", "patch", "delete")),
                        (("services", "ingresses.networking.k8s.io"), ("create", "delete")))
"""docs/security.md: "it creates, patches and deletes pods, and creates and deletes services and
ingresses, only through RoleBindings in the job namespaces"; docs/armada.md's table: "create,
patch, delete pods; create, delete services and ingresses"."""


def other_namespaces(platform: Platform, rendered) -> list[str]:
    """Namespaces that are not job namespaces: the program's others, and Kubernetes' own."""
    return [n for n in [*program_namespaces(rendered), "default", "kube-system"] if n not in job_namespaces(platform)]


@pytest.mark.after("test_1_preview_and_up_test")
def test_the_executor_reads_cluster_wide_and_writes_only_in_job_namespaces(platform: Platform, rendered, baseline):
    """docs/security.md "Executor and binoculars hold least privilege" (EXECUTOR_READS and
    EXECUTOR_WRITES above): exactly both in each job namespace, the reads alone everywhere else."""
    for executor in executors(platform):
        for namespace in job_namespaces(platform):
            assert granted(platform, baseline, executor, namespace) == EXECUTOR_READS | EXECUTOR_WRITES, namespace
        for namespace in other_namespaces(platform, rendered):
            assert granted(platform, baseline, executor, namespace) == EXECUTOR_READS, namespace


@pytest.mark.after("test_1_preview_and_up_test")
def test_the_executor_may_not_impersonate_mint_tokens_or_proxy_to_nodes(platform: Platform, rendered):
    """docs/security.md: "No impersonation, token creation or `nodes/proxy`"; docs/armada.md: "No
    impersonation, no `serviceaccounts/token`, no `tokenreviews`, no `nodes/proxy`, no writes to
    nodes or events" (and, of pods, no `update`)."""
    for executor in executors(platform):
        allowed = []
        for verb, resource, sub in (("impersonate", "users", None), ("impersonate", "groups", None),
                                    ("impersonate", "serviceaccounts", None), ("impersonate", "userextras", None),
                                    ("create", "tokenreviews.authentication.k8s.io", None),
                                    ("get", "nodes", "proxy"), ("create", "nodes", "proxy"), ("patch", "nodes", None),
                                    ("update", "nodes", None), ("delete", "nodes", None)):
            if can_i(platform, executor, verb, resource, "default", sub):
                allowed.append(f"{verb} {resource}{'/' + sub if sub else ''}")
        for namespace in job_namespaces(platform):
            for verb, resource, sub in (("create", "serviceaccounts", "token"), ("create", "events", None),
                                        ("patch", "events", None), ("update", "pods", None),
                                        ("deletecollection", "pods", None), ("get", "secrets", None),
                                        ("create", "pods", "exec"), ("get", "pods", "log")):
                if can_i(platform, executor, verb, resource, namespace, sub):
                    allowed.append(f"{verb} {resource}{'/' + sub if sub else ''} in {namespace}")
        assert not allowed, f"{executor[0]} may {allowed}"


@pytest.mark.after("test_1_preview_and_up_test")
def test_binoculars_only_reads_job_logs(platform: Platform, rendered, baseline):
    """docs/security.md: "Binoculars may only read `pods/log` in the job namespaces (no cordoning)".
    The example stacks leave `armada.binoculars.enabled` false: then it has no account and no role on
    the cluster, which is what is checked."""
    armada = platform.config("test").platform.armada
    binoculars = account(armada.namespace, BINOCULARS)
    if armada.binoculars.enabled:
        for namespace in job_namespaces(platform):
            assert granted(platform, baseline, binoculars, namespace) == rules((("pods/log",), ("get",))), namespace
        for namespace in other_namespaces(platform, rendered):
            assert granted(platform, baseline, binoculars, namespace) == set(), namespace
    else:
        assert platform.cluster.api("GET", "/apis/rbac.authorization.k8s.io/v1/clusterroles/"
                                           "cloudstation-armada-binoculars-jobs") is None
        assert platform.cluster.api("GET", f"/api/v1/namespaces/{armada.namespace}/serviceaccounts/{BINOCULARS}") is None


@pytest.mark.after("test_1_preview_and_up_test")
def test_no_other_armada_account_may_do_anything(platform: Platform, rendered, baseline):
    """docs/armada.md "Pod security": "Only executors, binoculars and a scheduler of more than one
    replica (its Lease) mount a Kubernetes API token"; docs/security.md names
    `test_no_armada_service_account_may_write_cluster_wide`. Every other account of the Armada
    namespace, as rendered, may do nothing there, in the job namespaces or cluster-wide."""
    armada = platform.config("test").platform.armada
    executor_users = {e[0] for e in executors(platform)}
    accounts = [o["metadata"]["name"] for o in objects(rendered, "ServiceAccount") if o["metadata"]["namespace"] == armada.namespace]
    others = [a for a in accounts if service_account_user(armada.namespace, a) not in executor_users
              and a != BINOCULARS]
    assert others
    for name in others:
        identity = account(armada.namespace, name)
        for namespace in [armada.namespace, *job_namespaces(platform), "default"]:
            rights = granted(platform, baseline, identity, namespace)
            if name == SCHEDULER and armada.scheduler.replicas > 1 and namespace == armada.namespace:
                rights = {r for r in rights if r[0] != "leases.coordination.k8s.io"}
            assert rights == set(), f"{name} in {namespace}: {sorted(rights)}"


OPERATOR_IN_WATCHED = rules(
    (("statefulstores.cloudstate.io", "statefulservices.cloudstate.io"), READ),
    (("statefulstores.cloudstate.io/status", "statefulservices.cloudstate.io/status"), ("update",)),
    (("deployments.apps",), ("get", "list", "create", "update", "delete")))
"""docs/security.md "The operator writes only in the namespaces it watches": "in each watched
namespace only what its source does there (StatefulStores and StatefulServices: get, list, watch,
update status; Deployments: get, list, create, update, delete)"."""
OPERATOR_OWN = rules((("configmaps",), ("get", "watch"), [OPERATOR_CONFIG_MAP]))
"""docs/security.md: "in its own namespace it may get and watch its ConfigMap"."""


@pytest.mark.after("test_1_preview_and_up_test")
def test_the_operator_writes_only_in_the_namespaces_it_watches(platform: Platform, rendered, baseline):
    """docs/security.md: the operator "has no ClusterRole and no ClusterRoleBinding at all", its own
    ConfigMap in its namespace, the rules above in each watched namespace (a prod namespace once the
    prod stack, which grants them, is deployed), and "No Roles, RoleBindings, Services, pods or
    Secrets anywhere"."""
    config = platform.config("test")
    own = config.platform.namespace
    operator = account(own, OPERATOR)
    config_maps = [o for o in rendered["test"] if o["kind"] == "ConfigMap" and o["metadata"]["name"] == OPERATOR_CONFIG_MAP]
    watched = parse_operator_config(config_maps[0]["data"]["config"])["watch.namespaces"]
    deployed = [n for n in watched if platform.cluster.api("GET", f"/api/v1/namespaces/{n}") is not None]
    assert set(deployed) >= {o["metadata"]["namespace"] for o in objects(rendered, "StatefulService")}
    assert granted(platform, baseline, operator, own) == OPERATOR_OWN
    for namespace in deployed:
        assert granted(platform, baseline, operator, namespace) == OPERATOR_IN_WATCHED, namespace
    for namespace in [n for n in [*program_namespaces(rendered), "default", "kube-system"] if n not in [own, *watched]]:
        assert granted(platform, baseline, operator, namespace) == set(), namespace
    for namespace in [own, *deployed]:
        for verb, resource in (("create", "roles"), ("create", "rolebindings"), ("create", "services"),
                               ("create", "pods"), ("get", "secrets"), ("list", "secrets")):
            assert not can_i(platform, operator, verb, resource, namespace), f"{verb} {resource} in {namespace}"
    subject = {"kind": "ServiceAccount", "name": OPERATOR, "namespace": own}
    cluster_bindings = [b["metadata"]["name"] for b in platform.cluster.api(
        "GET", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings")["items"] if subject in (b.get("subjects") or [])]
    assert cluster_bindings == []
    bound_in = {b["metadata"]["namespace"] for b in platform.cluster.api(
        "GET", "/apis/rbac.authorization.k8s.io/v1/rolebindings")["items"] if subject in (b.get("subjects") or [])}
    assert bound_in == {own, *deployed}


@pytest.mark.after("test_1_preview_and_up_test")
def test_the_entities_account_only_reads_pods_of_its_namespace(platform: Platform, rendered, baseline):
    """docs/security.md: "its ServiceAccount `cloudstate-entities` may only get, list and watch pods of
    its namespace"; "the entities' ServiceAccount may not read Secrets" (where the registry's pull
    Secret is)."""
    entity_namespaces = sorted({o["metadata"]["namespace"] for o in objects(rendered, "ServiceAccount")
                                if o["metadata"]["name"] == "cloudstate-entities"})
    assert entity_namespaces
    for namespace in entity_namespaces:
        entities = account(namespace, "cloudstate-entities")
        assert granted(platform, baseline, entities, namespace) == rules((("pods",), READ)), namespace
        for other in [n for n in [*program_namespaces(rendered), "default"] if n != namespace]:
            assert granted(platform, baseline, entities, other) == set(), f"{namespace}'s entities in {other}"
        assert not can_i(platform, entities, "get", "secrets", namespace)
        assert not can_i(platform, entities, "list", "secrets", namespace)


@pytest.mark.after("test_1_preview_and_up_test")
def test_jobs_and_builds_run_with_no_api_rights(platform: Platform, rendered, baseline):
    """docs/security.md: "An Armada job's pod | ... | no API rights (`jobServiceAccount` is granted
    nothing)"; build pods are Armada jobs of the builds namespace and run as the same account
    (infra/builds.py job_item)."""
    name = platform.config("test").platform.armada.job_service_account
    for namespace in job_namespaces(platform):
        identity = account(namespace, name)
        for where in [namespace, "default"]:
            assert granted(platform, baseline, identity, where) == set(), f"{namespace}/{name} in {where}"


@pytest.mark.after("test_1_preview_and_up_test")
def test_no_api_token_where_the_account_may_do_nothing(platform: Platform, rendered, baseline):
    """docs/security.md "No API token where nothing calls the API": "The PostgreSQL and Cassandra
    servers, their setup Jobs and the registry run with `automountServiceAccountToken: false`";
    tests/test_project_environments.py: "every pod whose ServiceAccount no binding grants anything
    mounts no token". Every pod of the program, as the ServiceAccount admission plugin left it
    (a token is a projected volume with a serviceAccountToken source), against what the authorizer
    lets its account do in its namespace and cluster-wide."""
    rights: dict[tuple[str, str], bool] = {}
    checked = []
    for namespace in program_namespaces(rendered):
        for item in platform.cluster.api("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]:
            if item["metadata"].get("deletionTimestamp") or "e2e" in item["metadata"]["name"]:
                continue
            name = item["spec"].get("serviceAccountName", "default")
            if (namespace, name) not in rights:
                identity = account(namespace, name)
                rights[namespace, name] = bool(granted(platform, baseline, identity, namespace)
                                               | granted(platform, baseline, identity, "default"))
            if rights[namespace, name]:
                continue
            tokens = [v["name"] for v in item["spec"].get("volumes", [])
                      if any("serviceAccountToken" in s for s in v.get("projected", {}).get("sources", []))]
            checked.append(f"{namespace}/{item['metadata']['name']}")
            assert not tokens, f"{namespace}/{item['metadata']['name']} ({name}, granted nothing) mounts {tokens}"
    assert checked


# --- the build submitter and the read-only preview ---------------------------------------------


SUBMITTER_RULES = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
                   {"apiGroups": [""], "resources": ["pods/portforward"], "verbs": ["get", "create"]}]
"""docs/builds.md "How `pulumi up` reaches the registry": "Your kube user needs, in the platform
namespace: `list` on `pods`, and `get` and `create` on `pods/portforward` (a WebSocket upgrade is
authorized as `get`, and from Kubernetes 1.35 also as `create`)", with this YAML."""


def without(rule: Optional[str]) -> list[dict]:
    """SUBMITTER_RULES less one `<verb> <resource>` (None: all of them)."""
    if rule is None:
        return SUBMITTER_RULES
    verb, resource = rule.split()
    found = []
    for entry in SUBMITTER_RULES:
        verbs = [v for v in entry["verbs"] if not (entry["resources"] == [resource] and v == verb)]
        if verbs:
            found.append({**entry, "verbs": verbs})
    return found


@pytest.mark.after("test_1_preview_and_up_test")
@pytest.mark.parametrize("missing", [None, "list pods", "get pods/portforward", "create pods/portforward"])
def test_the_build_submitters_documented_rights_reach_the_registry(platform: Platform, scratch, missing):
    """The EntityBuild provider's own tunnel (components/kube_tunnel.py, with the program's
    `registryTunnel` input: infra/builds.py registry_tunnel) as a user holding exactly the documented
    rules reaches the registry (it answers its own 401); without one of them, "the error says which
    verb was refused". `create` is needed from 1.35 on (kubernetes/kubernetes#134577, feature gate
    AuthorizePodWebsocketUpgradeCreatePermission, beta and on by default since 1.35)."""
    from components import kube_tunnel

    config = platform.config("test")
    name = f"submitter-{(missing or 'all').replace(' ', '-').replace('/', '-')}"
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": f"e2e-security-{name}", "namespace": config.platform.namespace}, "rules": without(missing)}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": f"e2e-security-{name}", "namespace": config.platform.namespace},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"e2e-security-{name}"},
               "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": scratch}]}
    user = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": scratch}}
    minor = int(platform.cluster.version().split(".")[1])
    refused = missing in ("list pods", "get pods/portforward") or (missing == "create pods/portforward" and minor >= 35)
    with applied(platform, user, role, binding):
        identity = account(scratch, name)
        wait_until("the role applies", lambda: can_i(platform, identity, "get", "pods", config.platform.namespace,
                                                     "portforward") == (missing != "get pods/portforward")
                   and can_i(platform, identity, "list", "pods", config.platform.namespace) == (missing != "list pods"))
        kubeconfig = token_kubeconfig(platform, scratch, name, platform.work / f"kubeconfig-{name}")
        dial = kube_tunnel.dialer(registry_tunnel(config), env={"KUBECONFIG": str(kubeconfig)}, timeout=20)
        if refused:
            with pytest.raises(kube_tunnel.TunnelError) as error:
                dial(20)
            action = "list pods" if missing == "list pods" else "open a port-forward"
            assert f"refused to {action}" in str(error.value) and "HTTP 403" in str(error.value), str(error.value)
            return
        connection = dial(20)
        try:
            connection.sendall(b"GET /v2/ HTTP/1.1\r\nHost: registry\r\nConnection: close\r\n\r\n")
            answer = b""
            while b"\r\n" not in answer:
                chunk = connection.recv(4096)
                if not chunk:
                    break
                answer += chunk
        finally:
            connection.close()
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]


def read_only_role(platform: Platform, rendered_objects: list[dict]) -> list[dict]:
    """docs/operations.md "What read-only means for the preview": "a ServiceAccount bound to a
    ClusterRole with only `get`, `list` and `watch` on the kinds the stack declares (`python -m infra
    render --stack test --out rendered/test` lists them), **without Secrets**". Each kind's resource
    name from the API server's discovery."""
    kinds = {(o["apiVersion"], o["kind"]) for o in rendered_objects if o["kind"] != "Secret"}
    by_group: dict[str, set[str]] = {}
    for api_version in sorted({v for v, _ in kinds}):
        path = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        names = {r["kind"]: r["name"] for r in platform.cluster.api("GET", path)["resources"] if "/" not in r["name"]}
        group = api_version.rpartition("/")[0]
        for version, kind in kinds:
            if version == api_version:
                by_group.setdefault(group, set()).add(names[kind])
    return [{"apiGroups": [group], "resources": sorted(resources), "verbs": list(READ)}
            for group, resources in sorted(by_group.items())]


@pytest.mark.after("test_1_preview_and_up_test")
def test_the_read_only_preview_credentials_suffice_for_a_preview(platform: Platform, rendered, scratch, baseline):
    """docs/operations.md: the preview's cluster credentials are read-only, and "pulumi-kubernetes
    diffs against the stack's state; the server-side dry-run apply it tries in preview is refused
    (Forbidden) and it falls back to a client-side preview of the inputs"; .github/workflows/ci.yml
    runs it without port-forwards. With the documented role and a change pending (the Lookout
    pruner's schedule, in the copy's stack file, restored after), `pulumi preview --diff` succeeds
    and shows the change; the role may write nothing and read no Secret. (A role without any rule
    previews this stack just as well: nothing in it reads an object, and a refused dry-run falls back.)"""
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "e2e-security-preview"}, "rules": read_only_role(platform, rendered["test"])}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": "e2e-security-preview"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "e2e-security-preview"},
               "subjects": [{"kind": "ServiceAccount", "name": "preview", "namespace": scratch}]}
    user = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "preview", "namespace": scratch}}
    stack_file = platform.repo / "Pulumi.test.yaml"
    original = stack_file.read_text()
    schedule = "17 3 * * 0"
    with applied(platform, user, role, binding):
        identity = account(scratch, "preview")
        wait_until("the role applies", lambda: can_i(platform, identity, "list", "deployments.apps"))
        assert {r[2] for r in granted(platform, baseline, identity, "default")} <= set(READ)
        assert not can_i(platform, identity, "get", "secrets", platform.config("test").platform.namespace)
        kubeconfig = token_kubeconfig(platform, scratch, "preview", platform.work / "kubeconfig-preview")
        document = yaml.safe_load(original)
        settings = document["config"]["cloudstation:platform"]["armada"]
        settings.setdefault("lookout", {}).setdefault("pruning", {})["schedule"] = schedule
        stack_file.write_text(yaml.safe_dump(document, sort_keys=False))
        try:
            preview = platform.pulumi("preview", "--stack", "test", "--diff",
                                      env={"KUBECONFIG": str(kubeconfig)}).check()
        finally:
            stack_file.write_text(original)
    assert "armada-lookout-pruner" in preview.output and schedule in preview.output, preview.tail()
    # The credentials reached the cluster: with any it refuses (an invalid token), pulumi-kubernetes
    # marks the cluster unreachable, warns and still previews (provider/pkg/provider/provider.go
    # `clusterUnreachable`: "Cluster is unreachable, skipping replaceUnready check").
    assert "Cluster is unreachable" not in preview.output, preview.tail()
