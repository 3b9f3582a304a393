"""The private registry: config validation, the pure builders, the Registry component and the
registry access of both stack files (managed in test, shared in prod), plus external mode."""
from __future__ import annotations

import base64
import hashlib
import json

from pathlib import Path

import bcrypt
import pulumi
import pulumi_kubernetes as k8s
import pytest
import yaml

from components import kept_secret
from components import registry as reg
from components.namespace import Namespace, NamespaceArgs
from infra import delivery, versions
from cloudstation_tools import checks, render, validate
from infra import config as stack_config
from cloudstation_tools.mocks import is_wrapped_secret
from infra.context import StackContext
from tests import stacks
from tests.conftest import find, objects, pod_spec, spec_violations

REGISTRY_OBJECTS = [
    ("ConfigMap", "registry-config"), ("ConfigMap", "registry-gate"), ("Deployment", "registry"),
    ("NetworkPolicy", "registry"), ("PersistentVolumeClaim", "registry-data"), ("Secret", "registry-auth"),
    ("Secret", "registry-htpasswd"), ("Service", "registry"),
]
"""What a managed registry consists of (kind, name), besides the pull Secrets and each project's
kept pull credential `registry-pull-<project>`."""
GATE_IMAGE = versions.image(reg.GATE_IMAGE)
PROJECTS = ["shop", "platform"]


def deployment(config=None, name: str = "registry", **options) -> dict:
    gate = reg.gate_config(PROJECTS, "cloudstation", True)
    return reg.deployment_spec(name, options.pop("image", versions.image("registry")), config or managed(), GATE_IMAGE,
                               gate, **options)


def managed(**values) -> reg.RegistryConfig:
    return reg.RegistryConfig.model_validate(values)


def with_registry(stack: str, registry: dict, secrets: dict[str, str] | None = None) -> render.StackFile:
    """The stack file with `platform.registry` replaced (and extra secure keys)."""
    stack_file = stacks.read(stack)
    platform = json.loads(stack_file.values["cloudstation:platform"])
    platform["registry"] = registry
    stack_file.values["cloudstation:platform"] = json.dumps(platform)
    for key, value in (secrets or {}).items():
        stack_file.values[f"cloudstation:{key}"] = value
        stack_file.secret_keys.append(f"cloudstation:{key}")
    return stack_file


def problems(stack_file: render.StackFile) -> list[str]:
    with pytest.raises(stack_config.ConfigError) as error:
        stacks.load(stack_file.values)
    return error.value.problems


def as_object(kind: str, api_version: str, name: str, spec: dict) -> dict:
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "namespace": "cloudstation"}, "spec": spec}


# --- config -----------------------------------------------------------------------------------

ECR = "123456789012.dkr.ecr.eu-west-1.amazonaws.com"


@pytest.mark.parametrize(
    "registry, secrets, expected",
    [
        ({"mode": "external", "url": "ftp://registry.example.com", "username": "u"}, {"registryPassword": "x"},
         "cloudstation:platform.registry.url: 'ftp://registry.example.com' — must be [https://]host[:port][/path]"),
        ({"mode": "external", "url": "http://registry.example.com", "username": "u"}, {"registryPassword": "x"},
         "cloudstation:platform.registry.url: 'http://registry.example.com' — plain http:// is only possible for localhost"),
        ({"mode": "external", "url": "registry.example.com/Upper", "username": "u"}, {"registryPassword": "x"},
         "cloudstation:platform.registry.url: 'registry.example.com/Upper' — must be"),
        ({"mode": "external", "username": "u"}, {"registryPassword": "x"},
         "cloudstation:platform.registry.url: (not set) — mode: external needs the registry's url"),
        ({"mode": "external", "url": ECR}, {"registryPassword": "x"},
         "cloudstation:platform.registry.username: (not set) — mode: external needs the registry's username (`AWS` for ECR)"),
        ({"mode": "external", "url": ECR, "username": "AWS"}, {},
         "cloudstation:platform.registry (registryPassword): (not set) — mode: external needs the password as a secret: "
         "pulumi config set --secret cloudstation:registryPassword <password>"),
        ({"mode": "external", "url": ECR, "username": "AWS", "nodePort": 32000}, {"registryPassword": "x"},
         "cloudstation:platform.registry.nodePort: 32000 — only for mode: managed or shared"),
        ({"mode": "external", "url": ECR, "username": "AWS", "storage": {"size": "1Gi"}}, {"registryPassword": "x"},
         'cloudstation:platform.registry.storage: {"size": "1Gi", "storageClass": null} — only for mode: managed'),
        ({"url": ECR}, {}, f"cloudstation:platform.registry.url: '{ECR}' — only for mode: external"),
        ({"mode": "shared", "username": "u"}, {}, "cloudstation:platform.registry.username: 'u' — only for mode: managed or external"),
        ({"nodePort": 80}, {}, "cloudstation:platform.registry.nodePort: 80 — input should be greater than or equal to 30000"),
        ({"loadBalancer": True}, {},
         "cloudstation:platform.registry.loadBalancerSourceRanges: [] — loadBalancer needs the client CIDRs it admits"),
        ({"nodeCidrs": ["10.0.0.300/8"]}, {}, "cloudstation:platform.registry.nodeCidrs[0]: '10.0.0.300/8' — "),
        ({"pushHost": "https://registry.example.com"}, {},
         "cloudstation:platform.registry.pushHost: 'https://registry.example.com' — must be host[:port]"),
        ({"mode": "elsewhere"}, {}, "cloudstation:platform.registry.mode: 'elsewhere' — must be one of 'managed', 'shared' or 'external'"),
        ({"nodeport": 32001}, {}, "cloudstation:platform.registry.nodeport: unknown key — allowed keys: mode, "),
    ],
)
def test_bad_registry_config_is_named_with_its_value_and_what_is_allowed(registry, secrets, expected):
    found = problems(with_registry("test", registry, secrets))
    assert len(found) == 1 and found[0].startswith(expected), found


def test_external_registry_urls_give_host_and_repository_prefix():
    config = reg.RegistryConfig.model_validate(
        {"mode": "external", "url": f"https://{ECR}/team/cloudstation/", "username": "AWS"}
    )
    assert (config.pull_host, config.repository_prefix, config.effective_push_host) == (ECR, "team/cloudstation", ECR)
    local = reg.RegistryConfig.model_validate({"mode": "external", "url": "http://localhost:5000", "username": "u"})
    assert (local.pull_host, local.repository_prefix) == ("localhost:5000", "")


def test_managed_pull_host_is_the_node_port_on_localhost_and_push_host_may_differ():
    assert managed(nodePort=31234).pull_host == "localhost:31234"
    assert managed(nodePort=31234).effective_push_host == "localhost:31234"
    assert managed(pushHost="registry.example.com").effective_push_host == "registry.example.com"


# --- pure builders ----------------------------------------------------------------------------


def test_htpasswd_entry_is_bcrypt_and_verifies():
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    line = kept_secret.htpasswd("cloudstation", hashed)
    user, _, stored = line.rstrip("\n").partition(":")
    assert user == "cloudstation" and stored.startswith("$2")
    assert bcrypt.checkpw(b"s3cret", stored.encode()) and not bcrypt.checkpw(b"wrong", stored.encode())


def test_dockerconfigjson_holds_basic_auth_for_the_pull_host():
    auths = json.loads(reg.dockerconfigjson("localhost:32000", "cloudstation", "pw"))["auths"]
    assert list(auths) == ["localhost:32000"]
    assert base64.b64decode(auths["localhost:32000"]["auth"]).decode() == "cloudstation:pw"


def test_registry_config_file_has_auth_storage_and_debug_health_but_no_secret():
    settings = yaml.safe_load(reg.registry_config_yaml())
    assert settings["auth"] == {"htpasswd": {"realm": "cloudstation", "path": "/auth/htpasswd"}}
    assert settings["storage"]["filesystem"]["rootdirectory"] == reg.DATA_PATH
    # The API on loopback only: every client goes through the gate on :5000 (components/registry_gate.py).
    assert settings["http"]["addr"] == "127.0.0.1:5002" and settings["http"]["debug"]["addr"] == ":5001"
    assert settings["health"]["storagedriver"]["enabled"] is True
    assert "secret" not in settings["http"]  # REGISTRY_HTTP_SECRET comes from the Secret


def test_registry_pod_is_restricted_probed_and_bounded():
    spec = deployment()
    pod = spec["template"]["spec"]
    name = "Deployment cloudstation/registry"
    assert spec_violations(name, pod) == []
    registry, gate = pod["containers"]
    for container in (registry, gate):
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert registry["readinessProbe"]["httpGet"] == {"path": "/debug/health", "port": "debug"}
    assert registry["livenessProbe"]["tcpSocket"] == {"port": "debug"}  # its API is on loopback, out of the kubelet's reach
    assert {p["name"]: p["containerPort"] for p in registry["ports"]} == {"debug": 5001}
    assert registry["env"] == [
        {"name": "REGISTRY_HTTP_SECRET", "valueFrom": {"secretKeyRef": {"name": "registry-auth", "key": "http-secret"}}}
    ]
    assert (gate["name"], gate["image"]) == ("gate", GATE_IMAGE)
    assert gate["command"] == ["python3", "-I", "/etc/registry-gate/registry_gate.py"]
    assert gate["args"] == ["--policy", "/etc/registry-gate/policy.json", "--listen", ":5000",
                            "--upstream", "127.0.0.1:5002"]
    assert {p["name"]: p["containerPort"] for p in gate["ports"]} == {"http": 5000}
    assert gate["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert gate["livenessProbe"]["tcpSocket"] == {"port": "http"}
    assert "env" not in gate or all("valueFrom" not in e for e in gate["env"])  # the gate holds no secret
    assert spec["strategy"] == {"type": "Recreate"} and spec["replicas"] == 1
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"] == {"claimName": "registry-data"}
    assert volumes["auth"]["secret"]["secretName"] == "registry-htpasswd"
    assert volumes["gate"]["configMap"] == {"name": "registry-gate"}
    assert [m["name"] for m in gate["volumeMounts"]] == ["gate"]
    assert "emptyDir" in volumes["tmp"]


def test_config_changes_roll_the_registry_pod():
    """A new registry config, gate program or policy is a new pod template."""
    rolled = lambda spec: spec["template"]["metadata"]["annotations"]["cloudstation.io/config-sha256"]  # noqa: E731
    gate = reg.gate_config(PROJECTS, "cloudstation", True)
    base = rolled(reg.deployment_spec("registry", "img:1", managed(), GATE_IMAGE, gate))
    assert base == rolled(reg.deployment_spec("registry", "img:2", managed(), GATE_IMAGE, dict(gate)))
    assert base != rolled(reg.deployment_spec("registry", "img:1", managed(), GATE_IMAGE, gate, metrics=True))
    assert base != rolled(reg.deployment_spec("registry", "img:1", managed(), GATE_IMAGE,
                                              reg.gate_config([*PROJECTS, "games"], "cloudstation", True)))
    assert base != rolled(reg.deployment_spec("registry", "img:1", managed(), GATE_IMAGE,
                                              {**gate, reg.GATE_PROGRAM: gate[reg.GATE_PROGRAM] + "\n"}))


def test_the_gate_config_map_is_the_gate_itself_and_its_policy_without_secrets():
    from components import registry_access
    from components import registry_gate

    data = reg.gate_config(PROJECTS, "cloudstation", True)
    assert data[reg.GATE_PROGRAM] == Path(registry_gate.__file__).read_text()
    assert json.loads(data[reg.GATE_POLICY]) == registry_access.gate_policy(PROJECTS, "cloudstation", True)
    assert registry_gate.load_policy(json.loads(data[reg.GATE_POLICY])).users.keys() == {
        "cloudstation", "build-shop", "build-platform", "pull-shop", "pull-platform"}
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "registry-gate"}, "data": data}
    assert checks.configmap_violations("ConfigMap cloudstation/registry-gate", config_map) == []


def test_service_is_a_node_port_unless_a_load_balancer_is_asked_for():
    default = reg.service_spec("registry", managed(nodePort=31000))
    assert default["type"] == "NodePort" and "loadBalancerSourceRanges" not in default
    assert default["ports"][0]["nodePort"] == 31000 and default["externalTrafficPolicy"] == "Local"
    lb = reg.service_spec("registry", managed(loadBalancer=True, loadBalancerSourceRanges=["203.0.113.0/24"]))
    assert lb["type"] == "LoadBalancer" and lb["loadBalancerSourceRanges"] == ["203.0.113.0/24"]


def test_network_policy_admits_only_client_namespaces_nodes_and_asked_for_ingress():
    config = managed(
        nodeCidrs=["10.0.0.0/16"],
        loadBalancer=True,
        loadBalancerSourceRanges=["203.0.113.0/24"],
        ingress={"host": "registry.example.com", "controllerNamespace": "ingress-nginx"},
    )
    spec = reg.network_policy_spec("registry", config, ["shop-test", "cloudstation", "shop-test"])
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"port": 5000, "protocol": "TCP"}]
    assert rule["from"] == [
        {"namespaceSelector": {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["cloudstation", "shop-test"]}]}},
        {"ipBlock": {"cidr": "10.0.0.0/16"}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}},
        {"ipBlock": {"cidr": "203.0.113.0/24"}},
    ]
    assert spec["policyTypes"] == ["Ingress", "Egress"] and spec["egress"] == []
    default = reg.network_policy_spec("registry", managed(), ["cloudstation"])
    assert len(default["ingress"][0]["from"]) == 1


def test_optional_exposure_objects_pass_the_official_schemas():
    config = managed(
        loadBalancer=True, loadBalancerSourceRanges=["203.0.113.0/24"],
        ingress={"host": "registry.example.com", "className": "nginx", "tlsSecretName": "registry-tls",
                 "controllerNamespace": "ingress-nginx"},
    )
    built = [
        as_object("Service", "v1", "registry", reg.service_spec("registry", config)),
        as_object("NetworkPolicy", "networking.k8s.io/v1", "registry",
                  reg.network_policy_spec("registry", config, ["cloudstation"])),
        as_object("Ingress", "networking.k8s.io/v1", "registry", reg.ingress_spec("registry", config.ingress)),
        as_object("Deployment", "apps/v1", "registry", deployment(config, image="img:1")),
    ]
    assert validate.validate_all(built) == []
    assert built[2]["spec"]["tls"] == [{"hosts": ["registry.example.com"], "secretName": "registry-tls"}]


# --- the component and the access, under mocks ------------------------------------------------


def test_registry_component_keeps_a_bcrypt_htpasswd_of_a_generated_password_in_a_secret(mocked):
    """The values come from a KeptSecret of `registry-auth` (components/kept_secret.py): read back from
    the cluster when the Secret is kept from an earlier deployment, else generated."""
    @pulumi.runtime.test
    def build():
        component = reg.Registry(
            "registry",
            reg.RegistryArgs(config=managed(username="pusher"), namespace="cloudstation",
                             client_namespaces=["cloudstation"], image="img:1", projects=PROJECTS,
                             builds_in_cluster=True, gate_image=GATE_IMAGE),
        )
        return component.password

    build()  # returns once every registration has completed
    by_name = {r.name: r for r in mocked.registrations}
    values = by_name["registry-auth-values"]
    assert values.type == "pulumi-python:dynamic/secrets:KeptSecret"
    assert (values.inputs["namespace"], values.inputs["name"]) == ("cloudstation", "registry-auth")
    assert values.inputs["lengths"] == {"password": 32, "http-secret": 48}
    assert values.inputs["htpasswd"] == {"key": "htpasswd", "username": "pusher", "passwordKey": "password"}
    assert values.urn in by_name["registry-auth"].dependencies
    secret = by_name["registry-auth"].inputs
    assert is_wrapped_secret(secret["stringData"])
    data = secret["stringData"]["value"]
    assert data["htpasswd"].startswith("pusher:$2") and data["htpasswd"].endswith("\n")
    assert data["username"] == "pusher" and data["password"] and data["http-secret"]
    children = [r for r in mocked.registrations if r.name != "registry"]
    assert {r.parent for r in children} == {by_name["registry"].urn}
    assert all(r.name.startswith("registry-") for r in children)


def test_each_project_gets_a_kept_pull_user_and_a_build_user_and_distribution_all_their_lines(mocked):
    """Pull credentials are kept like `registry-auth` (prod's pull Secrets hold them); build
    credentials open no kept data and are plain RandomPasswords; distribution's htpasswd file (its
    own Secret, not kept) has one bcrypt line per user."""
    from components import registry_access

    seen: dict = {}

    @pulumi.runtime.test
    def build():
        component = reg.Registry(
            "registry",
            reg.RegistryArgs(config=managed(), namespace="cloudstation", client_namespaces=["cloudstation"],
                             image="img:1", projects=PROJECTS, builds_in_cluster=True, gate_image=GATE_IMAGE),
        )
        seen.update(pulls=component.pull_passwords, builds=component.build_passwords)
        return component.password

    build()
    assert sorted(seen["pulls"]) == sorted(seen["builds"]) == sorted(PROJECTS)
    by_name = {r.name: r for r in mocked.registrations}
    for project in PROJECTS:
        values = by_name[f"registry-pull-{project}-values"]
        assert (values.inputs["name"], values.inputs["lengths"]) == (f"registry-pull-{project}", {"password": 32})
        assert values.inputs["htpasswd"] == {"key": "htpasswd", "username": f"pull-{project}", "passwordKey": "password"}
        secret = by_name[f"registry-pull-{project}"]
        assert secret.inputs["stringData"]["value"]["username"] == f"pull-{project}"
        assert by_name[f"registry-build-{project}-password"].type == "random:index/randomPassword:RandomPassword"
    assert not any(name.startswith("registry-build-") and name.endswith("-values") for name in by_name)
    htpasswd = by_name["registry-htpasswd"].inputs
    assert is_wrapped_secret(htpasswd["stringData"])
    lines = htpasswd["stringData"]["value"]["htpasswd"].splitlines()
    assert [line.split(":", 1)[0] for line in lines] == sorted(registry_access.usernames(PROJECTS, "cloudstation", True))
    assert all(line.split(":", 1)[1].startswith("$2") for line in lines)
    assert json.loads(by_name["registry-gate"].inputs["data"][reg.GATE_POLICY]) == registry_access.gate_policy(
        PROJECTS, "cloudstation", True)
    deployment = by_name["registry-deploy"]
    for dependency in ("registry-htpasswd", "registry-gate", "registry-auth", "registry-config"):
        assert by_name[dependency].urn in deployment.dependencies, dependency


def test_the_project_name_builds_is_reserved_for_the_build_contexts():
    """A project `builds` would have images `builds/<entity>` and a build user with rights on
    `builds/*`: every project's build contexts."""
    values = stacks.read("test").values
    values["cloudstation:projects"] = values["cloudstation:projects"].replace('"name": "shop"', '"name": "builds"')
    with pytest.raises(stack_config.ConfigError, match=r"projects\[0\]\.name: 'builds' — 'builds' is reserved"):
        stacks.load(values)


@pytest.mark.parametrize("username", ["build-shop", "pull-x"])
def test_the_deployers_user_name_cannot_be_a_build_or_pull_user(username):
    with pytest.raises(ValueError, match="build-<project> and pull-<project>"):
        managed(username=username)


def access_for(stack_file: render.StackFile, seen: dict):
    """Run deploy_registry + image_pull_secret for a stack file's config under the active mocks."""
    config = stacks.load(stack_file.values)
    pulumi.runtime.set_all_config(stack_file.values, stack_file.secret_keys)

    @pulumi.runtime.test
    def run():
        provider = k8s.Provider("kubernetes")
        stack = StackContext(config, "unit", provider)
        namespace = Namespace("platform", NamespaceArgs(name=config.platform.namespace), stack.opts)
        access = delivery.deploy_registry(stack, namespace)
        delivery.image_pull_secret("pull-platform", access, "platform", namespace.name, stack.opts)
        seen["access"] = access
        return access.dockerconfigjson("platform").apply(lambda value: seen.update(dockerconfigjson=json.loads(value)))

    run()
    return seen["access"]


def pull_secret_config(mocked) -> dict:
    (pull,) = [r for r in mocked.registrations if r.name == "pull-platform"]
    assert pull.inputs["type"] == "kubernetes.io/dockerconfigjson"
    assert is_wrapped_secret(pull.inputs["stringData"])
    return json.loads(pull.inputs["stringData"]["value"][".dockerconfigjson"])


@pytest.fixture
def prod_file() -> render.StackFile:
    """The promoted prod stack file, read before `mocked` installs its mocks (the first read renders
    the test stack, with mocks of its own)."""
    return stacks.read("prod")


def test_shared_mode_reads_the_owners_credentials_and_runs_nothing(prod_file, mocked):
    seen: dict = {}
    access = access_for(prod_file, seen)
    auths = seen["dockerconfigjson"]["auths"]
    assert list(auths) == ["localhost:32000"]
    # The owner's kept pull credential of the project (platform: project-state's namespace), the fake
    # existing Secret `cloudstation/registry-pull-platform` of cloudstation_tools/mocks.py.
    assert auths["localhost:32000"]["username"] == "username-of-cloudstation/registry-pull-platform"
    assert auths["localhost:32000"]["password"] == "password-of-cloudstation/registry-pull-platform"
    assert pull_secret_config(mocked) == seen["dockerconfigjson"]
    assert not [r for r in mocked.registrations if r.type.startswith(("kubernetes:apps", "random:"))]
    assert access.pull_host == "localhost:32000" and access.registry is None


def test_external_mode_uses_the_configured_credentials(mocked):
    stack_file = with_registry("test", {"mode": "external", "url": f"{ECR}/cloudstation", "username": "AWS"},
                               {"registryPassword": "ecr-token"})
    seen: dict = {}
    access = access_for(stack_file, seen)
    expected = {ECR: {"username": "AWS", "password": "ecr-token", "auth": base64.b64encode(b"AWS:ecr-token").decode()}}
    assert seen["dockerconfigjson"]["auths"] == expected
    assert pull_secret_config(mocked)["auths"] == expected
    assert (access.pull_host, access.repository("shop", "cart")) == (ECR, "cloudstation/shop/cart")


# --- the rendered graph of both stack files ---------------------------------------------------


def registry_objects(rendered) -> list[dict]:
    return [o for o in rendered.manifests() if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "registry"]


def test_test_stack_runs_the_registry_once_and_prod_shares_it(rendered):
    config = stacks.validate_config(rendered.stack)
    found = registry_objects(rendered)
    pull_secrets = [o for o in found if o["metadata"]["name"] == delivery.PULL_SECRET_NAME]
    registry = sorted((o["kind"], o["metadata"]["name"]) for o in found if o not in pull_secrets)
    if rendered.stack == "test":
        assert config.platform.registry.mode == "managed"
        pulls = [("Secret", f"registry-pull-{project}") for project in delivery.image_projects(config)]
        assert registry == sorted(REGISTRY_OBJECTS + pulls)  # each exactly once
        assert {o["metadata"]["namespace"] for o in found if o not in pull_secrets} == {config.platform.namespace}
        assert find(rendered, "Secret", "registry-auth")["type"] == "Opaque"
    else:
        assert config.platform.registry.mode == "shared"
        assert registry == []
    assert pull_secrets and all(o["type"] == "kubernetes.io/dockerconfigjson" for o in pull_secrets)


def test_every_entity_namespace_gets_the_pull_secret(rendered):
    config = stacks.validate_config(rendered.stack)
    namespaces = {
        o["metadata"]["namespace"]
        for o in objects(rendered, "Secret")
        if o["metadata"]["name"] == delivery.PULL_SECRET_NAME and o["type"] == "kubernetes.io/dockerconfigjson"
    }
    assert namespaces == set(delivery.client_namespaces(config))


def test_rendered_registry_is_restricted_probed_pinned_and_fenced(rendered_stacks):
    rendered = rendered_stacks["test"]
    config = stacks.validate_config("test")
    deployment = find(rendered, "Deployment", "registry", config.platform.namespace)
    pod = pod_spec(deployment)
    assert checks.restricted_violations("registry", pod) == []
    assert checks.resource_violations("registry", pod) == []
    container, gate = pod["containers"]
    assert container["image"] == versions.image("registry", config.platform.image_mirror)
    assert gate["image"] == versions.image(reg.GATE_IMAGE, config.platform.image_mirror)
    assert container["readinessProbe"]["httpGet"]["path"] == "/debug/health"
    claim = find(rendered, "PersistentVolumeClaim", "registry-data", config.platform.namespace)
    assert claim["spec"]["resources"]["requests"]["storage"] == config.platform.registry.storage.size
    service = find(rendered, "Service", "registry", config.platform.namespace)
    assert service["spec"]["type"] == "NodePort"
    assert service["spec"]["ports"][0]["nodePort"] == config.platform.registry.node_port
    assert not [o for o in objects(rendered, "Ingress") if o["metadata"]["name"] == "registry"]  # off by default
    policy = find(rendered, "NetworkPolicy", "registry", config.platform.namespace)
    peers = policy["spec"]["ingress"][0]["from"]
    # Build pods (builds.mode: armada) fetch contexts and push images too.
    assert peers[0]["namespaceSelector"]["matchExpressions"][0]["values"] == sorted(
        delivery.client_namespaces(config) + delivery.registry_build_clients(config))
    assert [p["ipBlock"]["cidr"] for p in peers[1:]] == [str(c) for c in config.platform.registry.node_cidrs]
    config_map = find(rendered, "ConfigMap", "registry-config", config.platform.namespace)
    assert "[secret]" not in config_map["data"]["config.yml"]


def test_registry_outputs_name_the_pull_host_and_keep_the_password_secret(rendered):
    registry = rendered.outputs["registry"]
    assert registry["pullHost"] == "localhost:32000"
    assert registry["mode"] == stacks.validate_config(rendered.stack).platform.registry.mode
    if rendered.stack == "test":
        assert rendered.outputs["registryPassword"] == render.SECRET
    assert "password" not in json.dumps(registry).lower()


def test_prod_stack_file_images_are_pulled_from_the_registry_of_the_cluster():
    config = stacks.validate_config("prod")
    for project, entity in delivery.all_entities(config):
        assert entity.image.startswith(f"{config.platform.registry.pull_host}/{project}/{entity.name}:"), entity.image


def test_external_mode_renders_no_registry_and_pushes_to_the_external_host():
    stack_file = with_registry("test", {"mode": "external", "url": f"https://{ECR}/cloudstation", "username": "AWS"},
                               {"registryPassword": "token"})
    rendered = stacks.render("test", stack_file=stack_file)
    assert [o["kind"] for o in registry_objects(rendered) if o["kind"] != "Secret"] == []
    assert not [o for o in objects(rendered, "Secret") if o["metadata"]["name"] == "registry-auth"]
    assert rendered.outputs["registry"] == {
        "mode": "external", "pullHost": ECR, "pushHost": ECR, "username": "AWS", "url": f"https://{ECR}/cloudstation",
    }
    for key, ref in rendered.outputs["images"].items():
        assert ref.startswith(f"{ECR}/cloudstation/{key}:") and "@sha256:" in ref
    for image in rendered.of_type("docker:index/image:Image"):
        assert image.inputs["imageName"].startswith(f"{ECR}/cloudstation/")
        assert image.inputs["registry"]["value"]["server"] == ECR
    assert "registryPassword" not in rendered.outputs


@pytest.mark.parametrize("delete_enabled", [reg.registry_settings()["storage"]["delete"]["enabled"], True])
def test_the_registry_refuses_deletes(delete_enabled, tmp_path):
    """The managed registry's own storage setting, on a real distribution registry: a DELETE of a
    manifest by digest is refused (405), so the push-capable credential every entity namespace
    holds cannot remove an image a stack runs. The second case (deletion on) shows the check bites."""
    from tests.registry_server import RegistryServer, build_oci_image

    with RegistryServer(tmp_path / "registry", delete_enabled=delete_enabled) as server:
        digest = server.push(build_oci_image(tmp_path / "layout", "v1", b"entity"), "shop/cart", "v1")
        response = server.session.delete(f"{server.url}/v2/shop/cart/manifests/{digest}", auth=server.auth, timeout=5)
        if delete_enabled:
            assert response.status_code == 202 and server.digest_of("shop/cart", digest) is None
        else:
            assert response.status_code == 405, response.text
            assert server.digest_of("shop/cart", digest) == digest
    assert reg.registry_settings()["storage"]["delete"] == {"enabled": False}


def test_registry_serves_the_config_file_it_is_given(rendered_stacks):
    # distribution 3.x's image runs `registry serve <file>` for a *.yml argument (docker-library
    # registry:3.1.1 entrypoint.sh) and its default moved to /etc/distribution (2.x read
    # /etc/docker/registry): the argument must be exactly where our ConfigMap's file is mounted,
    # else the registry cannot open it (or, mounted elsewhere without an argument, serves the
    # image's built-in config: no auth, deletes on).
    rendered = rendered_stacks["test"]
    namespace = stacks.validate_config("test").platform.namespace
    pod = pod_spec(find(rendered, "Deployment", "registry", namespace))
    container = pod["containers"][0]
    config_volumes = {v["name"]: v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v
                      and any(m["name"] == v["name"] for m in container["volumeMounts"])}
    [(volume, config_map_name)] = config_volumes.items()
    [mount] = [m for m in container["volumeMounts"] if m["name"] == volume]
    config_map = find(rendered, "ConfigMap", config_map_name, namespace)
    [key] = config_map["data"]
    assert container.get("command") is None  # the image's entrypoint picks `registry serve`
    assert container["args"] == [f"{mount['mountPath']}/{key}"]
    served = yaml.safe_load(config_map["data"][key])
    assert served["auth"]["htpasswd"]["path"].startswith(
        next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "auth")
    )
