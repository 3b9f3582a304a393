"""Armada's security (issue 11, item 1): authentication with generated credentials, least
privilege of the executors and binoculars, the admission policy that keeps jobs in their
namespaces, and who may reach the user-facing ports.

The admission policy's CEL is compiled and evaluated here with cel-python (a pure-Python CEL
implementation) against admission requests shaped like Kubernetes' AdmissionRequest. Not
executed here: the API server's own type-checking and cost estimation of the expressions, and the
admission chain itself (that the ServiceAccount admission plugin fills in `serviceAccountName`
before validating admission runs)."""
from __future__ import annotations

import json
import re

import celpy
import pytest
import yaml

from components.armada import auth as armada_auth
from components.armada.cluster import (
    EXECUTOR_CLUSTER_ROLE, EXECUTOR_JOB_RULES, EXECUTOR_JOBS_ROLE, EXECUTOR_RULES, JOB_POLICY, job_policy,
    service_account_user,
)
from components.armada.config import SERVER, SCHEDULER, executor_name
from components.armada.settings import ArmadaConfig
from infra import config as stack_config
from cloudstation_tools import validate
from tests.stacks import config_of
from tests.conftest import find, objects, pod_spec
from tests.test_armada_config import load, minimal_stack, recorded

WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "impersonate", "bind", "escalate", "*"}


@pytest.fixture
def rendered(armada_rendered):
    return armada_rendered


def armada(rendered) -> ArmadaConfig:
    return config_of(rendered).platform.armada


# --- the admission policy ------------------------------------------------------------------------


def compile_cel(expression: str):
    environment = celpy.Environment()
    return environment.program(environment.compile(expression))


def evaluate(expression: str, request: dict, obj: dict) -> bool:
    activation = {"request": celpy.json_to_cel(request), "object": celpy.json_to_cel(obj)}
    result = compile_cel(expression).evaluate(activation)
    assert isinstance(result, celpy.celtypes.BoolType), (expression, result)
    return bool(result)


def admitted(policy: dict, request: dict, obj: dict) -> bool:
    """What the API server decides for a policy bound with validationActions [Deny]: not matched
    (matchConstraints, matchConditions) -> admitted; matched -> every validation must hold."""
    # A subresource request (e.g. `kubectl debug`: pods/ephemeralcontainers, whose object is the Pod)
    # matches only a rule naming `<resource>/<subresource>` (admissionregistration/v1 Rule.resources).
    name = request["resource"]["resource"] + (f"/{request['subResource']}" if request.get("subResource") else "")
    resource = (request["resource"]["group"], name, request["operation"])
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    if not any(g in r["apiGroups"] and res in r["resources"] and op in r["operations"]
               for r in rules for g, res, op in [resource]):
        return True
    if not all(evaluate(c["expression"], request, obj) for c in policy["spec"].get("matchConditions", [])):
        return True
    return all(evaluate(v["expression"], request, obj) for v in policy["spec"]["validations"])


def admission_request(user: str, namespace: str, kind: str = "Pod", operation: str = "CREATE",
                      sub_resource: str = "") -> dict:
    group, resource = {"Pod": ("", "pods"), "Service": ("", "services"), "Ingress": ("networking.k8s.io", "ingresses")}[kind]
    request = {
        "kind": {"group": group, "version": "v1", "kind": kind},
        "resource": {"group": group, "version": "v1", "resource": resource},
        "namespace": namespace, "operation": operation,
        "userInfo": {"username": user, "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"]},
    }
    if sub_resource:
        # The subresource's kind is the parent's: pods/ephemeralcontainers is a Pod (kubernetes
        # pkg/registry/core/pod/storage EphemeralContainersREST), so `object` is the whole Pod.
        request["subResource"] = sub_resource
    return request


def job_pod(namespace: str, service_account: str = "default", labels: dict | None = None, **spec) -> dict:
    metadata = {"name": "armada-01abc-0", "namespace": namespace,
                "labels": {"armada_job_id": "01abc", "armada_queue_id": "research", **(labels or {})}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"serviceAccountName": service_account, "containers": [{"name": "job", "image": "busybox"}], **spec}}


def test_the_policy_and_its_binding_are_rendered_and_valid(rendered):
    policy = find(rendered, "ValidatingAdmissionPolicy", JOB_POLICY)
    binding = find(rendered, "ValidatingAdmissionPolicyBinding", JOB_POLICY)
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert policy["spec"]["failurePolicy"] == "Fail"
    # Bound in every namespace (no matchResources), denying.
    assert binding["spec"] == {"policyName": JOB_POLICY, "validationActions": ["Deny"]}
    assert validate.validate_all([policy, binding]) == []  # every supported Kubernetes version


def test_every_expression_of_the_policy_compiles(rendered):
    policy = find(rendered, "ValidatingAdmissionPolicy", JOB_POLICY)
    expressions = [c["expression"] for c in policy["spec"]["matchConditions"]]
    expressions += [v["expression"] for v in policy["spec"]["validations"]]
    # The executors, the namespaces, the account, the labels, no platform registry image or image ID; with a
    # builds namespace: only the build queues' jobs run there, (platform.builds.userNamespace) only in their
    # own user namespace, each with its own project's build Secret only (infra/builds.py admission).
    builds = bool(rendered.of_type("cloudstation:builds:BuildsNamespace"))
    assert len(expressions) == 5 + 2 * builds + (builds and config_of(rendered).platform.builds.user_namespace)
    for expression in expressions:
        compile_cel(expression)
    with pytest.raises(celpy.CELParseError):  # the check can fail
        compile_cel("request.namespace in [")


MATCHED_KINDS = {("", "pods"): "io.k8s.api.core.v1.Pod", ("", "services"): "io.k8s.api.core.v1.Service",
                 ("networking.k8s.io", "ingresses"): "io.k8s.api.networking.v1.Ingress"}
"""The schema definition of each resource the policy may match (kubernetes-validate's `_definitions.json`)."""
OBJECT_FIELDS = re.compile(r"(?<![\w.])(?:object|oldObject)((?:\.[A-Za-z_]\w*)+)")
"""A statically typed field path on the admitted object: `object.spec.hostUsers`, not `dyn(object.spec).hostUsers`
(the match stops at `object.spec`, which every kind has)."""


def schema_definitions(version: str) -> dict:
    import kubernetes_validate.utils
    return kubernetes_validate.utils.schema_contents(
        f"kubernetes-json-schema/v{version}.0-local/_definitions.json", version)["$defs"]


def undefined_fields(expression: str, definition: str, definitions: dict) -> list[str]:
    """The paths of `expression` that name a field `definition` does not have: what the API server's
    type check reports as "undefined field" for that kind. A map (labels) or a scalar ends the walk
    (what follows is a key or a function)."""
    found = []
    for match in OBJECT_FIELDS.finditer(expression):
        schema = definitions[definition]
        for name in match[1].split(".")[1:]:
            while "$ref" in schema:
                schema = definitions[schema["$ref"].rsplit("/", 1)[-1]]
            if "properties" not in schema:
                break
            if name not in schema["properties"]:
                found.append(f"{match[0]}: undefined field {name!r} of {definition.rsplit('.', 1)[-1]}")
                break
            schema = schema["properties"][name]
    return found


def test_every_expression_type_checks_against_every_kind_it_matches(rendered):
    """The API server type-checks each validation against every kind `matchConstraints` matches and
    writes what does not check into `status.typeChecking.expressionWarnings` (kubernetes
    staging/src/k8s.io/apiserver/pkg/admission/plugin/policy/validating/typechecking.go `Check`,
    `typesToCheck`: `object` typed per matched kind). A Pod field read as `object.spec.<field>` is
    "undefined field" for Service and Ingress even behind `request.kind.kind != 'Pod' ||`; admission
    itself compiles `object` as dyn (plugin/cel/compile.go), so the guard works, but the policy is
    reported as broken. Reading pod-only fields through `dyn(...)` leaves them to that guard. The
    end-to-end tier reads the real status (e2e/test_security.py); this is its offline counterpart,
    seen failing on `object.spec.serviceAccountName` and `object.spec.hostUsers`."""
    policy = find(rendered, "ValidatingAdmissionPolicy", JOB_POLICY)
    # Subresources (pods/ephemeralcontainers) are not type-checked on their own (typechecking.go
    # `extractResources` skips any resource with a "/"): their object is the parent's kind.
    kinds = [MATCHED_KINDS[(group, resource)] for rule in policy["spec"]["matchConstraints"]["resourceRules"]
             for group in rule["apiGroups"] for resource in rule["resources"] if "/" not in resource]
    assert sorted(kinds) == sorted(MATCHED_KINDS.values())
    for version in validate.SUPPORTED_VERSIONS:
        definitions = schema_definitions(version)
        problems = [f"validations[{i}] @ {version}: {problem}"
                    for i, validation in enumerate(policy["spec"]["validations"]) for kind in kinds
                    for problem in undefined_fields(validation["expression"], kind, definitions)]
        assert problems == []
    # The check can fail: a Pod field read statically, and a field no kind has.
    definitions = schema_definitions(validate.SUPPORTED_VERSIONS[-1])
    assert undefined_fields("object.spec.hostUsers == false", MATCHED_KINDS[("", "services")], definitions)
    assert undefined_fields("object.metadata.labelz == {}", MATCHED_KINDS[("", "pods")], definitions)
    assert not undefined_fields("has(dyn(object.spec).hostUsers) && object.metadata.labels.exists(k, k == 'a')",
                                MATCHED_KINDS[("", "services")], definitions)


def test_the_policy_applies_to_exactly_the_executors(rendered):
    policy = find(rendered, "ValidatingAdmissionPolicy", JOB_POLICY)
    settings = armada(rendered)
    executors = [service_account_user(settings.namespace, executor_name(e)) for e in settings.executors]
    outside = job_pod("kube-system")
    for user in executors:
        assert not admitted(policy, admission_request(user, "kube-system"), outside), user
    # Anyone else is not this policy's business (RBAC and Pod Security decide for them).
    for user in ("kubernetes-admin", service_account_user(settings.namespace, SERVER),
                 service_account_user("other", executor_name(settings.executors[0]))):
        assert admitted(policy, admission_request(user, "kube-system"), outside), user


def test_jobs_stay_in_the_job_namespaces_as_the_designated_account_without_platform_labels(rendered):
    policy = find(rendered, "ValidatingAdmissionPolicy", JOB_POLICY)
    settings = armada(rendered)
    executor = service_account_user(settings.namespace, executor_name(settings.executors[0]))
    account = settings.job_service_account
    for job_namespace in settings.job_namespaces:
        request = admission_request(executor, job_namespace)
        assert admitted(policy, request, job_pod(job_namespace, account))
        assert admitted(policy, admission_request(executor, job_namespace, operation="UPDATE"), job_pod(job_namespace, account))
        # Borrowing an identity: the executor's own account, or any other.
        for other in (executor_name(settings.executors[0]), "cloudstate-operator", "admin"):
            assert not admitted(policy, request, job_pod(job_namespace, other)), other
        assert not admitted(policy, request, job_pod(job_namespace, account, serviceAccount="builder"))
        # The platform's labels: its part-of value, and any key in its label domain.
        for labels in ({"app.kubernetes.io/part-of": "cloudstation"}, {"armada.cloudstation.io/scheduler-client": "true"},
                       {"cloudstation.io/project": "shop"}):
            assert not admitted(policy, request, job_pod(job_namespace, account, labels)), labels
        for labels in ({"app.kubernetes.io/part-of": "research"}, {"notcloudstation.io/x": "1"}, {"cloudstation": "x"}):
            assert admitted(policy, request, job_pod(job_namespace, account, labels)), labels
        # Services and ingresses of jobs: in the job namespaces only.
        service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "armada-01abc-0-service-0"}, "spec": {}}
        assert admitted(policy, admission_request(executor, job_namespace, "Service"), service)
        assert not admitted(policy, admission_request(executor, settings.namespace, "Service"), service)
        assert not admitted(policy, admission_request(executor, "kube-system", "Ingress"), {"metadata": {}, "spec": {}})
    for namespace in ("kube-system", settings.namespace, "default"):
        assert not admitted(policy, admission_request(executor, namespace), job_pod(namespace, account)), namespace


def test_a_designated_job_account_is_created_and_enforced():
    policy = job_policy(["system:serviceaccount:armada:armada-executor-a"], ["jobs"], "builder")
    request = admission_request("system:serviceaccount:armada:armada-executor-a", "jobs")
    assert admitted(policy, request, job_pod("jobs", "builder"))
    assert not admitted(policy, request, job_pod("jobs", "default"))


# --- least privilege ----------------------------------------------------------------------------


def bindings_of(rendered, namespace: str, account: str) -> list[dict]:
    return [
        o for o in objects(rendered)
        if o["kind"] in ("RoleBinding", "ClusterRoleBinding")
        and {"kind": "ServiceAccount", "name": account, "namespace": namespace} in o.get("subjects", [])
    ]


def test_executors_read_cluster_wide_and_write_only_in_job_namespaces(rendered):
    settings = armada(rendered)
    roles = {o["metadata"]["name"]: o for o in objects(rendered, "ClusterRole")}
    assert roles[EXECUTOR_CLUSTER_ROLE]["rules"] == EXECUTOR_RULES
    assert roles[EXECUTOR_JOBS_ROLE]["rules"] == EXECUTOR_JOB_RULES
    for executor in settings.executors:
        account = executor_name(executor)
        found = bindings_of(rendered, settings.namespace, account)
        cluster = [b for b in found if b["kind"] == "ClusterRoleBinding"]
        local = [b for b in found if b["kind"] == "RoleBinding"]
        assert [b["roleRef"]["name"] for b in cluster] == [EXECUTOR_CLUSTER_ROLE]
        builds_namespaces = [o["metadata"]["name"] for o in objects(rendered, "Namespace")
                             if o["metadata"]["name"] == f"{config_of(rendered).platform.namespace}-build"]  # infra/builds.py
        assert sorted(b["metadata"]["namespace"] for b in local) == sorted([*settings.job_namespaces, *builds_namespaces])
        assert {b["roleRef"]["name"] for b in local} == {EXECUTOR_JOBS_ROLE}


def test_no_armada_service_account_may_write_cluster_wide(rendered):
    settings = armada(rendered)
    roles = {o["metadata"]["name"]: o for o in objects(rendered, "ClusterRole")}
    accounts = {o["metadata"]["name"] for o in objects(rendered, "ServiceAccount") if o["metadata"]["namespace"] == settings.namespace}
    for account in accounts:
        for binding in bindings_of(rendered, settings.namespace, account):
            if binding["kind"] != "ClusterRoleBinding":
                continue
            verbs = {v for rule in roles[binding["roleRef"]["name"]]["rules"] for v in rule["verbs"]}
            assert not verbs & WRITE_VERBS, (account, binding["roleRef"]["name"], verbs & WRITE_VERBS)


# --- credentials --------------------------------------------------------------------------------


def test_services_get_their_credentials_from_secrets(rendered):
    settings = armada(rendered)
    secrets = {o["metadata"]["name"] for o in objects(rendered, "Secret") if o["metadata"]["namespace"] == settings.namespace}
    expected = {SERVER, SCHEDULER, *(executor_name(e) for e in settings.executors)}
    deployments = {o["metadata"]["name"]: o for o in objects(rendered, "Deployment") if o["metadata"]["namespace"] == settings.namespace}
    for name, deployment in deployments.items():
        # .get: not every Deployment there is an Armada service (monitoring's store exporters).
        volumes = {v["name"]: v for v in pod_spec(deployment).get("volumes", [])}
        annotations = deployment["spec"]["template"]["metadata"].get("annotations", {})
        if name not in expected:
            assert "auth" not in volumes, name
            continue
        secret = volumes["auth"]["secret"]
        assert secret["secretName"] == f"{name}-auth" and secret["secretName"] in secrets, name
        assert secret["defaultMode"] == 0o440
        [container] = pod_spec(deployment)["containers"]
        assert {"name": "auth", "mountPath": armada_auth.AUTH_DIR, "readOnly": True} in container["volumeMounts"]
        assert container["args"][-2:] == ["--config", armada_auth.AUTH_PATH]
        assert len(annotations["cloudstation.io/credentials-checksum"]) == 16, name
    # People log in with the admin's (and each configured user's) Secret.
    assert {"armada-admin", *(f"armada-user-{u.name}" for u in settings.auth.users)} <= secrets


def test_queues_are_managed_as_the_generated_queue_user(rendered):
    settings = armada(rendered)
    queues = [r for r in rendered.registrations if r.type == "pulumi-python:dynamic/armada:Queue"]
    assert queues
    for queue in queues:
        authorization = queue.inputs["authorization"]
        assert isinstance(authorization, dict) and "value" in authorization  # a secret in state
        assert authorization["value"].startswith("Basic ")
        user = __import__("base64").b64decode(authorization["value"].split()[1]).decode().split(":")[0]
        assert user == (settings.queue_api.username or armada_auth.QUEUES_USER)
        # Not the queue user: Armada would make the creator the owner of a queue without owners.
        assert armada_auth.QUEUES_USER not in queue.inputs["userOwners"] and queue.inputs["userOwners"]


SECRET = "hunter2-do-not-echo"


@pytest.mark.parametrize("armada_section, where", [
    # The review's case: it rendered into ConfigMap armada-scheduler.
    ({"scheduler": {"extra": {"postgres": {"connection": {"password": SECRET}}}}},
     "platform.armada.scheduler.extra.postgres.connection.password"),
    # Any case (Viper matches keys so), any depth, any service, lists too.
    ({"server": {"extra": {"Auth": {"BasicAuth": {"Users": {"bob": {"PASSWORD": SECRET}}}}}}},
     "platform.armada.server.extra.Auth.BasicAuth.Users.bob.PASSWORD"),
    ({"eventIngester": {"extra": {"redis": {"password": SECRET}}}}, "platform.armada.eventIngester.extra.redis.password"),
    ({"executors": [{"name": "a", "extra": {"pulsar": {"authToken": SECRET}}}]},
     "platform.armada.executors[0].extra.pulsar.authToken"),
    ({"lookout": {"extra": {"oidc": {"client_secret": SECRET}}}}, "platform.armada.lookout.extra.oidc.client_secret"),
    ({"binoculars": {"extra": {"tls": {"privateKey": SECRET}}}}, "platform.armada.binoculars.extra.tls.privateKey"),
    ({"schedulerIngester": {"extra": {"apiKeys": [SECRET]}}}, "platform.armada.schedulerIngester.extra.apiKeys"),
    ({"lookoutIngester": {"extra": {"postgres": {"connection": {"credentials": 12345678}}}}},
     "platform.armada.lookoutIngester.extra.postgres.connection.credentials"),
    # A value that is a credential whatever its key: a URL with a password, a private key.
    ({"server": {"extra": {"redis": {"addrs": [f"redis://:{SECRET}@redis.example.com:6379"]}}}},
     "platform.armada.server.extra.redis.addrs[0]"),
    ({"server": {"extra": {"tls": {"cert": "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----"}}}},
     "platform.armada.server.extra.tls.cert"),
])
def test_no_credential_in_plain_text_through_extra(armada_section, where):
    """`extra` is deep-merged into the service's ConfigMap: a credential there is plain text to anyone who
    may read ConfigMaps. Refused before any resource, naming the key and where the value belongs, and
    never echoing it."""
    with pytest.raises(stack_config.ConfigError) as error:
        load(armada_section)
    [problem] = error.value.problems
    assert problem.startswith(f"cloudstation:{where}: (value not shown) — "), problem
    assert SECRET not in str(error.value) and "12345678" not in str(error.value)
    for remedy in ("ConfigMap", "platform.armada.postgres", "platform.armada.redis", "platform.armada.auth.users",
                   "pulumi config set --secret --path"):
        assert remedy in problem, problem


def test_the_policy_pack_shares_the_definition():
    """The pack's ConfigMap and plain-config checks apply the same rule (infra/credentials.py): a list of
    literals under a credential's name, and a Redis URL (no user) with a password, are credentials there too."""
    from cloudstation_tools import checks

    assert checks.credential_value_violations("cm", {"apiKeys": ["k1"], "redis": {"addrs": ["redis://:pw@r:6379"]}}) == [
        "cm.apiKeys: a credential in plain text",
        "cm.redis.addrs[0]: holds a credential (private key, password hash or URL with a password)",
    ]


def test_extra_keeps_what_is_not_a_credential():
    """References to credentials (a key in a Secret, a file), switches and empty values are not credentials."""
    assert load({"scheduler": {"extra": {"postgres": {"connection": {"sslmode": "require", "password": ""}},
                                         "auth": {"anonymousAuth": False}}},
                 "server": {"extra": {"pulsar": {"authenticationEnabled": True, "jwtTokenPath": "/var/run/token"},
                                      "tls": {"keyPath": "/certs/tls.key"}, "openIdAuth": {"providerUrl": "https://id.example.com"}}},
                 "executors": [{"name": "a", "extra": {"kubernetes": {"passwordKey": "password"}}}]})


PASSWORDS = {p.name: f"pw-{p.name}" for p in armada_auth.all_principals(ArmadaConfig.model_validate(
    {"executors": [{"name": "a"}, {"name": "b"}], "binoculars": {"enabled": True},
     "auth": {"users": [{"name": "alice", "groups": ["research"]}]}}
))}


def full_config() -> ArmadaConfig:
    return ArmadaConfig.model_validate(
        {"executors": [{"name": "a"}, {"name": "b"}], "binoculars": {"enabled": True},
         "auth": {"users": [{"name": "alice", "groups": ["research"]}]}}
    )


def test_each_service_accepts_only_its_callers_each_in_its_own_group():
    config = full_config()
    server = armada_auth.server_auth_file(config, PASSWORDS)["auth"]["basicAuth"]["users"]
    scheduler = armada_auth.scheduler_auth_file(config, PASSWORDS)["auth"]["basicAuth"]["users"]
    binoculars = armada_auth.binoculars_auth_file(config, PASSWORDS)["auth"]["basicAuth"]["users"]
    assert {u: v["groups"] for u, v in server.items()} == {
        "admin": ["armada-admins"], "alice": ["research"],
        "cloudstation-scheduler": [], "cloudstation-queues": ["cloudstation-queue-managers"],
    }
    assert {u: v["groups"] for u, v in scheduler.items()} == {
        "cloudstation-server": [], "cloudstation-executor-a": ["cloudstation-executors"],
        "cloudstation-executor-b": ["cloudstation-executors"],
    }
    assert set(binoculars) == {"admin", "alice"}
    for users in (server, scheduler, binoculars):
        assert all(v["password"] == PASSWORDS[u] for u, v in users.items())
    # Clients log in as their own user.
    assert armada_auth.server_auth_file(config, PASSWORDS)["schedulerApiConnection"]["basicAuth"]["username"] == "cloudstation-server"
    assert armada_auth.scheduler_auth_file(config, PASSWORDS)["armadaApi"]["basicAuth"]["username"] == "cloudstation-scheduler"
    assert armada_auth.executor_auth_file(config.executors[1], PASSWORDS) == {
        "executorApiConnection": {"basicAuth": {"username": "cloudstation-executor-b", "password": "pw-cloudstation-executor-b"}}
    }


def test_credentials_files_have_armadas_key_shapes():
    """The shapes of upstream's auth examples (users under auth.basicAuth.users with password and
    groups; a client's basicAuth with username and password), recorded in tests/upstream/."""
    server_example = recorded("_local/server/config-auth.yaml")["keys"]
    [user] = server_example["auth"]["basicAuth"]["users"].values()
    generated = armada_auth.server_auth_file(full_config(), PASSWORDS)
    for entry in generated["auth"]["basicAuth"]["users"].values():
        assert set(entry) == set(user)
    armadactl = recorded("_local/.armadactl.yaml")["keys"]
    assert set(generated["schedulerApiConnection"]["basicAuth"]) == set(armadactl["contexts"]["auth-basic"]["basicAuth"])
    login = armada_auth.login_armadactl("c", "localhost:50051", False, "admin", "pw")
    assert login["contexts"]["c"] == {"armadaUrl": "localhost:50051", "forceNoTls": True,
                                       "basicAuth": {"username": "admin", "password": "pw"}}
    # Viper lowercases map keys: user names must be lowercase already.
    assert all(name == name.lower() for name in generated["auth"]["basicAuth"]["users"])


# --- config errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "armada_section, where",
    [
        ({"auth": {"anonymous": True}, "server": {"publicRestUrl": "https://armada.example.com"}},
         "armada.auth.anonymous: true — anonymous access is refused while the API is reachable beyond a port-forward (server.publicRestUrl set)"),
        ({"auth": {"anonymous": True}, "server": {"publicGrpcAddress": "armada.example.com:443"}},
         "(server.publicGrpcAddress set)"),
        ({"auth": {"anonymous": True}, "userAccess": {"namespaces": ["ingress-nginx"]}}, "(userAccess set)"),
        ({"auth": {"permissionGroupMapping": {"submit_any_jobs": ["everyone"]}}},
         "armada.auth.permissionGroupMapping.submit_any_jobs[0]: 'everyone' — every principal is in group 'everyone'"),
        ({"auth": {"executorGroups": ["cloudstation-executors"]}}, "armada.auth.executorGroups[0]: 'cloudstation-executors'"),
        ({"auth": {"users": [{"name": "admin"}]}}, "armada.auth.users[0].name: 'admin'"),
        ({"auth": {"users": [{"name": "Bob"}]}}, "armada.auth.users[0].name: 'Bob'"),
        ({"queues": [{"name": "q", "groupOwners": ["everyone"]}]}, "armada.queues[0].groupOwners[0]: 'everyone'"),
        ({"jobNamespaces": ["armada-jobs", "armada"]}, "armada.jobNamespaces[1]: 'armada' — job namespaces must not include the Armada namespace"),
        ({"executors": [{"name": "a", "extra": {"kubernetes": {"impersonateUsers": True}}}]},
         "armada.executors[0].extra.kubernetes.impersonateUsers: true — needs impersonating users"),
        # Binoculars' key is top-level (v0.22.7 BinocularsConfig.ImpersonateUsers), not the executor's.
        ({"binoculars": {"extra": {"impersonateUsers": True}}},
         "armada.binoculars.extra.impersonateUsers: true — needs impersonating users"),
        # Viper matches keys in any case, so the check does too.
        ({"executors": [{"name": "a", "extra": {"Kubernetes": {"ImpersonateUsers": True}}}]},
         "armada.executors[0].extra.Kubernetes.ImpersonateUsers: true — needs impersonating users"),
        ({"executors": [{"name": "a", "extra": {"metric": {"exposeQueueUsageMetrics": True}}}]},
         "armada.executors[0].extra.metric.exposeQueueUsageMetrics: true — needs the kubelet's stats through nodes/proxy"),
        # `extra` is merged over the generated config: it cannot switch anonymous access back on
        # where `auth.anonymous` would be refused, in any key case, nor name `everyone`.
        ({"server": {"publicRestUrl": "https://armada.example.com", "extra": {"auth": {"anonymousAuth": True}}}},
         "armada.server.extra.auth.anonymousAuth: true — anonymous access is refused while the API is reachable "
         "beyond a port-forward (server.publicRestUrl set)"),
        ({"userAccess": {"namespaces": ["ingress-nginx"]}, "server": {"extra": {"Auth": {"AnonymousAuth": "true"}}}},
         "armada.server.extra.Auth.AnonymousAuth: 'true' — anonymous access is refused"),
        ({"binoculars": {"enabled": True, "publicUrl": "https://logs.example.com",
                         "extra": {"AUTH": {"anonymousauth": True}}}},
         "armada.binoculars.extra.AUTH.anonymousauth: true — anonymous access is refused while the API is reachable "
         "beyond a port-forward (binoculars.publicUrl set)"),
        ({"scheduler": {"extra": {"auth": {"anonymousAuth": True}}}},
         "armada.scheduler.extra.auth.anonymousAuth: true — the scheduler only accepts the platform's own users"),
        ({"server": {"extra": {"auth": {"permissionGroupMapping": {"submit_any_jobs": ["admins", "everyone"]}}}}},
         "armada.server.extra.auth.permissionGroupMapping.submit_any_jobs[1]: 'everyone' — every principal is in group"),
        ({"scheduler": {"extra": {"AUTH": {"PermissionGroupMapping": {"execute_jobs": ["everyone"]}}}}},
         "armada.scheduler.extra.AUTH.PermissionGroupMapping.execute_jobs[0]: 'everyone'"),
        ({"binoculars": {"extra": {"auth": {"permissionGroupMapping": {"cordon_nodes": ["everyone"]}}}}},
         "armada.binoculars.extra.auth.permissionGroupMapping.cordon_nodes[0]: 'everyone'"),
        ({"lookout": {"extra": {"auth": {"permissionGroupMapping": {"cancel_jobs": ["everyone"]}}}}},
         "armada.lookout.extra.auth.permissionGroupMapping.cancel_jobs[0]: 'everyone'"),
    ],
)
def test_insecure_settings_are_config_errors_naming_the_key(armada_section, where):
    with pytest.raises(stack_config.ConfigError) as error:
        load(armada_section)
    assert where in str(error.value)


def test_job_namespaces_stay_out_of_the_platform():
    """A job pod may mount any Secret of its namespace, and the executor gets a RoleBinding in each job
    namespace: the platform's, the project-state's, every project's (test and prod: one Armada serves
    both stacks on a shared cluster), the other stacks' watched ones, Kubernetes' own and Armada's are
    refused, every one at once, naming the key."""
    reserved = {
        "cloudstation": "the platform namespace",
        "cloudstation-state": "the project-state namespace",
        "p-test": "project 'p'",
        "p-prod": "project 'p'",
        "cloudstation-prod-state": "platform.cloudstate.extraWatchedNamespaces",
        "kube-system": "a Kubernetes system namespace",
        "kube-public": "a Kubernetes system namespace",
        "kube-node-lease": "a Kubernetes system namespace",
        "default": "a Kubernetes system namespace",
        "armada": "the Armada namespace",
    }
    raw = minimal_stack({"cloudstate": {"extraWatchedNamespaces": ["cloudstation-prod-state"]},
                         "armada": {"jobNamespaces": ["armada-jobs", *reserved]}})
    with pytest.raises(stack_config.ConfigError) as error:
        stack_config.load(raw)
    problems = error.value.problems
    assert len(problems) == len(reserved), problems
    for index, (namespace, what) in enumerate(reserved.items(), start=1):
        problem = problems[index - 1]
        assert problem.startswith(f"cloudstation:platform.armada.jobNamespaces[{index}]: '{namespace}' — "), problem
        assert what in problem and "armada-jobs" in problem, problem
    # Another platform namespace moves what is reserved with it.
    raw["cloudstation:platform"] = {**raw["cloudstation:platform"], "namespace": "team-a", "cloudstate": {},
                                    "armada": {"jobNamespaces": ["cloudstation", "team-a-state"]}}
    with pytest.raises(stack_config.ConfigError) as error:
        stack_config.load(raw)
    assert [p.split(" — ")[0] for p in error.value.problems] == [
        "cloudstation:platform.armada.jobNamespaces[1]: 'team-a-state'"]
    assert load({"jobNamespaces": ["armada-jobs", "batch", "p-staging"]}).platform.armada.job_namespaces


def test_anonymous_access_is_allowed_only_behind_port_forwards():
    assert load({"auth": {"anonymous": True}}).platform.armada.auth.anonymous is True
    assert load({}).platform.armada.auth.anonymous is False
    # The same through `extra` (no public address, no userAccess), and switching it off anywhere.
    assert load({"server": {"extra": {"auth": {"anonymousAuth": True}}}}).platform.armada.server.extra
    assert load({"scheduler": {"extra": {"auth": {"anonymousAuth": False}}},
                 "server": {"publicRestUrl": "https://armada.example.com", "extra": {"auth": {"anonymousAuth": "false"}}},
                 "binoculars": {"extra": {"auth": {"permissionGroupMapping": {"cordon_nodes": ["armada-admins"]}}}}})


# --- who reaches the user-facing ports ----------------------------------------------------------


def ingress_rules(rendered, name: str) -> list[dict]:
    return find(rendered, "NetworkPolicy", name, armada(rendered).namespace)["spec"].get("ingress", [])


def test_user_facing_ports_admit_only_the_configured_sources(rendered):
    settings = armada(rendered)
    users = list(settings.user_access.peers())
    server = {p: [] for p in (50051, 8080)}
    for rule in ingress_rules(rendered, SERVER):
        for port in rule["ports"]:
            server[port["port"]] += rule["from"]
    # gRPC: the users' sources and the scheduler (it reads queues); REST: the users' sources.
    scheduler = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": SCHEDULER, "app.kubernetes.io/instance": SCHEDULER}}}
    canonical = lambda peers: sorted(json.dumps(p, sort_keys=True) for p in peers)  # noqa: E731
    assert canonical(server[50051]) == canonical([*users, scheduler])
    assert server[8080] == users
    lookout = [peer for rule in ingress_rules(rendered, "armada-lookout") for peer in rule["from"]]
    assert lookout == users
    for rule in [*ingress_rules(rendered, SERVER), *ingress_rules(rendered, "armada-lookout")]:
        assert rule.get("from"), "no rule without sources (that would admit everyone)"
