"""Network access of in-cluster builds (docs/builds.md, "Network access of builds").

Build pods reach DNS, the registry, the destinations `platform.builds.egress` declares and, only with
the named opt-in `platform.builds.publicEgress.enabled`, public addresses: `0.0.0.0/0` and `::/0`
on the opted ports, excepting every non-public block and every block the stack names
(infra/public_egress.py). That rule is the only one of the program open to every address; the checks
and the policy pack accept it in the builds namespace's `build-egress` policy of an opted-in stack
and nowhere else. A stack in `armada` mode whose builds could reach nothing to pull from is refused
before any resource is registered.
"""
from __future__ import annotations

import functools
import ipaddress
import json
import runpy
from typing import Optional

import pulumi
import pytest

from cloudstation_tools import checks, render
from components import build_job, builds_namespace
from infra import config as stack_config
from infra import public_egress
from policy import rules
from tests import stacks
from tests.conftest import ROOT, objects
from tests.test_network_policies import API_SERVER, INTERNET, SERVICE_IP, Address, Pod, cluster_of
from tests.test_policy import check_resource, network_policy

REQUIRED_EXCEPTS = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "100.64.0.0/10", "127.0.0.0/8")
"""What the rule must never reach, at least: private, link-local (cloud metadata), CGNAT, loopback."""
PUBLIC_V6 = "2606:4700::6810:1"
"""A public IPv6 address (a CDN's), as registry.npmjs.org resolves on a dual-stack node."""
KEY = "cloudstation:platform.builds.publicEgress.enabled"


def load(values: dict) -> stack_config.StackConfig:
    return stacks.load(values)


def edited_test_stack(builds: Optional[dict] = None, **platform) -> dict[str, str]:
    """The test stack file's config with `platform.builds` replaced (None: removed) and other
    platform keys changed."""
    def edit(old: dict) -> dict:
        new = {k: v for k, v in old.items() if k != "builds"}
        if builds is not None:
            new["builds"] = builds
        return {**new, **platform}

    return stacks.edited("test", platform=edit).values




def builds_policies(rendered) -> list[dict]:
    return [p for p in objects(rendered, "NetworkPolicy") if p["metadata"]["name"] == public_egress.POLICY]


def every_address_rules(rendered) -> list[tuple[str, str, dict]]:
    """(namespace, policy, rule) of every rule naming 0.0.0.0/0 or ::/0."""
    found = []
    for policy in objects(rendered, "NetworkPolicy"):
        for direction, key in (("ingress", "from"), ("egress", "to")):
            for rule in policy["spec"].get(direction) or []:
                if any(ipaddress.ip_network((p.get("ipBlock") or {}).get("cidr", "1.1.1.1/32")).prefixlen == 0
                       for p in rule[key]):
                    found.append((policy["metadata"]["namespace"], policy["metadata"]["name"], rule))
    return found


def api_server_accepts(block: dict) -> list[str]:
    """What kube-apiserver's ValidateIPBlock (kubernetes/kubernetes pkg/apis/networking/validation/
    validation.go) refuses: an except entry that is not a strict subset of `cidr` as Go's IPNet.Contains
    sees it (an IPv4-mapped IPv6 address is 4 bytes there, so never inside ::/0)."""
    cidr = ipaddress.ip_network(block["cidr"])
    problems = []
    for entry in block.get("except", []):
        net = ipaddress.ip_network(entry)  # strict: host bits zero
        mapped = net.version == 6 and net.network_address.ipv4_mapped is not None
        if net.version != cidr.version or mapped or not net.subnet_of(cidr) or net.prefixlen <= cidr.prefixlen:
            problems.append(entry)
    return problems


# --- the rendered policy with the opt-in -------------------------------------------------------------


def test_the_opted_in_stack_renders_exactly_the_public_rule_in_the_builds_namespace_only(rendered_stacks):
    rendered = rendered_stacks["test"]
    config = load(stacks.read("test").values)
    settings = config.platform.builds.public_egress
    assert settings.enabled, "the test stack file opts in (Pulumi.test.yaml, platform.builds.publicEgress)"
    namespace = config.platform.builds_namespace
    [(where, name, rule)] = every_address_rules(rendered)
    assert (where, name) == (namespace, public_egress.POLICY)
    [policy] = [p for p in builds_policies(rendered) if p["metadata"]["namespace"] == namespace]
    # The policy selects Armada's build pods only, and the rule is its last egress rule, exactly:
    assert policy["spec"]["podSelector"] == {"matchExpressions": [{"key": builds_namespace.BUILD_POD_LABEL,
                                                                    "operator": "Exists"}]}
    assert policy["spec"]["policyTypes"] == ["Egress"]
    assert policy["spec"]["egress"][-1] == rule
    stack_blocks = public_egress.named_cidrs(config.platform.model_dump(by_alias=True, mode="json"))
    assert stack_blocks, "the stack file names its nodes and API server"
    assert rule == {
        "to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": public_egress.excepts(4, stack_blocks)}},
               {"ipBlock": {"cidr": "::/0", "except": public_egress.excepts(6, stack_blocks)}}],
        "ports": [{"port": port, "protocol": "TCP"} for port in settings.ports],
    }
    assert [p["port"] for p in rule["ports"]] == [443]  # the default: HTTPS only, 80 only if asked
    v4 = [ipaddress.ip_network(c) for c in rule["to"][0]["ipBlock"]["except"]]
    for required in [*REQUIRED_EXCEPTS, *stack_blocks]:
        block = ipaddress.ip_network(required)
        if block.version == 4:
            assert any(block.subnet_of(e) for e in v4), required
    for peer in rule["to"]:
        assert api_server_accepts(peer["ipBlock"]) == [], peer
    # No other policy of either stack file names every address (prod never builds).
    assert every_address_rules(rendered_stacks["prod"]) == []
    assert builds_policies(rendered_stacks["prod"]) == []


def test_a_build_pod_reaches_public_https_and_nothing_private(rendered_stacks):
    """Simulated on both stack files' cluster (tests/test_network_policies.py's model): a build pod
    reaches a public address on 443 (IPv4 and IPv6) and nothing else outside the registry; no other
    pod gains anything from the opt-in."""
    rendered = rendered_stacks["test"]
    cluster = cluster_of(rendered_stacks)
    namespace = load(stacks.read("test").values).platform.builds_namespace
    build = Pod(namespace, "armada-01abc-0", {builds_namespace.BUILD_POD_LABEL: "01abc", "armada_queue_id": "shop-builds"})
    cluster.pods.append(build)
    assert cluster.allowed(build, Address(INTERNET), 443)
    assert cluster.allowed(build, Address(PUBLIC_V6), 443)
    for port in (80, 22, 6443, 5432):
        assert not cluster.allowed(build, Address(INTERNET), port), port
    private = [API_SERVER, SERVICE_IP, "169.254.169.254", "100.64.0.1", "127.0.0.1", "192.168.1.10", "10.244.0.5",
               "0.0.0.1", "fd00:10:244::5", "fe80::1", "::1", "64:ff9b::a00:1", "2002:a00:1::1"]
    for address in private:
        for port in (443, 6443, 80):
            assert not cluster.allowed(build, Address(address), port), (address, port)
    registry = cluster.pod(rendered.outputs["platformNamespace"], "registry")
    assert cluster.allowed(build, registry, 5000)
    for pod in cluster.pods:
        if pod is not build and pod.namespace != namespace and pod is not registry:
            assert not any(cluster.allowed(build, pod, port) for port in (443, 5432, 8080, 8013, 50051)), pod
    # Never for other namespaces: no pod the stacks run elsewhere reaches the internet on 443.
    governed = {p["metadata"]["namespace"] for p in cluster.policies}
    for pod in cluster.pods:
        if pod is not build and pod.namespace in governed:
            assert not cluster.allowed(pod, Address(INTERNET), 443), pod


@functools.lru_cache(maxsize=None)
def public_stack_render() -> render.Rendered:
    """The test stack with a control plane and nodes at public addresses, an extra excluded block
    and port 80 asked for."""
    values = edited_test_stack(
        builds={"publicEgress": {"enabled": True, "ports": [443, 80], "exceptCidrs": ["198.51.100.128/25"]}},
        kubernetesApi={"cidrs": ["203.0.113.10/32", "2001:db8:10::/64"]},
        registry={**json.loads(stacks.read("test").values["cloudstation:platform"])["registry"],
                  "nodeCidrs": ["203.0.113.0/28"]},
    )
    return stacks.render("test", stack_file=render.StackFile(values=values, secret_keys=stacks.read("test").secret_keys))


def test_the_rule_also_excepts_every_block_the_stack_names_and_takes_the_asked_ports():
    rendered = public_stack_render()
    [(_, _, rule)] = every_address_rules(rendered)
    v4, v6 = (peer["ipBlock"]["except"] for peer in rule["to"])
    # 203.0.113.10/32 lies inside the node block 203.0.113.0/28, which is excepted once.
    assert v4[len(public_egress.NON_PUBLIC_IPV4):] == ["198.51.100.128/25", "203.0.113.0/28"]
    assert v6[len(public_egress.NON_PUBLIC_IPV6):] == ["2001:db8:10::/64"]
    assert [p["port"] for p in rule["ports"]] == [443, 80]
    cluster = cluster_of({"test": rendered})
    build = Pod(load(edited_test_stack(builds={"publicEgress": {"enabled": True}})).platform.builds_namespace, "armada-1-0",
                {builds_namespace.BUILD_POD_LABEL: "1"})
    cluster.pods.append(build)
    for address in ("203.0.113.10", "203.0.113.3", "198.51.100.200", "2001:db8:10::1"):
        assert not cluster.allowed(build, Address(address), 443), address
    assert cluster.allowed(build, Address(INTERNET), 80)
    assert cluster.allowed(build, Address("203.0.113.99"), 443)


# --- refusing a stack whose builds can pull nothing -----------------------------------------------


def test_builds_that_can_reach_nothing_are_refused_naming_both_keys():
    with pytest.raises(stack_config.ConfigError) as error:
        load(edited_test_stack(builds=None))
    [problem] = error.value.problems
    assert problem.startswith(f"{KEY}: false — in-cluster builds (platform.builds.mode: armada, the default in a "
                              "stack running Armada) may reach only DNS and the registry"), problem
    for words in ("platform.builds.egress", "docker.io", "registry.npmjs.org", "protoc", "base images",
                  "registryMirrors", "builds.mode: local", "port 443"):
        assert words in problem, words
    # The same with the mode set explicitly, and registry mirrors alone (unreachable without egress).
    for builds in ({"mode": "armada"}, {"registryMirrors": ["mirror.example.com/dockerhub"]},
                   {"publicEgress": {"enabled": False}}):
        with pytest.raises(stack_config.ConfigError) as error:
            load(edited_test_stack(builds=builds))
        assert [p.split(" — ")[0] for p in error.value.problems] == [f"{KEY}: false"], builds
    # platform.imageMirror does not count either: build pods reach a mirror only at an egress address.
    with pytest.raises(stack_config.ConfigError, match="publicEgress.enabled: false"):
        load(edited_test_stack(builds=None, imageMirror="mirror.example.com/hub"))


def test_the_refusal_comes_before_any_resource(mocked):
    pulumi.runtime.set_all_config(edited_test_stack(builds=None))

    @pulumi.runtime.test
    def run():
        runpy.run_path(str(ROOT), run_name="__main__")  # ./__main__.py, as the engine runs it

    with pytest.raises(pulumi.RunError, match=r"cloudstation:platform\.builds\.publicEgress\.enabled: false — "):
        run()
    assert mocked.registrations == []


MIRRORS = [
    {"hosts": ["nexus.example.com"], "cidrs": ["10.20.30.0/24"], "ports": [8443]},
    {"hosts": ["verdaccio.tools.svc.cluster.local"], "ports": [4873]},
]


@functools.lru_cache(maxsize=None)
def mirrors_render() -> render.Rendered:
    values = edited_test_stack(builds={"egress": MIRRORS, "registryMirrors": ["nexus.example.com:8443/dockerhub"]})
    return stacks.render("test", stack_file=render.StackFile(values=values, secret_keys=stacks.read("test").secret_keys))


def test_declared_egress_alone_is_accepted_and_opens_no_public_address():
    """A user with in-house mirrors: accepted, and the builds reach exactly the registry and them."""
    config = load(edited_test_stack(builds={"egress": MIRRORS}))
    assert config.platform.build_mode == "armada" and not config.platform.builds.public_egress.enabled
    rendered = mirrors_render()
    assert every_address_rules(rendered) == []
    [policy] = builds_policies(rendered)
    destinations = [(rule["to"], [p["port"] for p in rule["ports"]]) for rule in policy["spec"]["egress"][1:]]
    assert destinations == [([{"ipBlock": {"cidr": "10.20.30.0/24"}}], [8443]),
                            ([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "tools"}}}], [4873])]


def test_local_mode_and_prod_need_no_opt_in():
    assert load(edited_test_stack(builds={"mode": "local"})).platform.build_mode == "local"
    prod = stacks.read("prod").values
    assert "builds" not in json.loads(prod["cloudstation:platform"])
    load(prod)
    platform = json.loads(prod["cloudstation:platform"])
    with pytest.raises(stack_config.ConfigError, match=r"cloudstation:platform\.builds: .* prod never builds"):
        load({**prod, "cloudstation:platform": json.dumps({**platform, "builds": {"publicEgress": {"enabled": True}}})})


@pytest.mark.parametrize("builds, expected", [
    ({"publicEgress": {"ports": [443, 80]}, "mode": "local"},
     "cloudstation:platform.builds.publicEgress.ports: [443,80] — only with enabled: true"),
    ({"publicEgress": {"enabled": True, "ports": [443, 443]}}, "cloudstation:platform.builds.publicEgress.ports: [443,443] — each port once"),
    ({"publicEgress": {"enabled": True, "exceptCidrs": ["0.0.0.0/0"]}},
     "cloudstation:platform.builds.publicEgress.exceptCidrs[0]: '0.0.0.0/0' — matches every address"),
    ({"egress": [{"hosts": ["registry.npmjs.org"], "allowAnyAddress": True}]},
     "cloudstation:platform.builds.egress[0].allowAnyAddress: true — not a key of an egress entry: to let builds "
     "reach services whose addresses cannot be listed (docker.io, registry.npmjs.org, GitHub), set "
     "platform.builds.publicEgress.enabled: true"),
    ({"egress": [{"hosts": ["registry.npmjs.org"]}]},
     "cloudstation:platform.builds.egress[0].cidrs: [] — required for a destination outside the cluster "
     "(registry.npmjs.org)"),
])
def test_bad_egress_settings_are_named(builds, expected):
    with pytest.raises(stack_config.ConfigError) as error:
        load(edited_test_stack(builds=builds))
    assert len(error.value.problems) == 1 and error.value.problems[0].replace(", ", ",").startswith(
        expected.replace(", ", ",")), error.value.problems


# --- the checks and the policy pack: 0.0.0.0/0 anywhere else is still refused --------------------------


def public_rule(ports=(443,)) -> dict:
    return {"to": public_egress.peers(), "ports": [{"port": p, "protocol": "TCP"} for p in ports]}


def egress_spec(*egress_rules: dict) -> dict:
    return {"podSelector": {}, "policyTypes": ["Egress"], "egress": list(egress_rules)}


BUILDS_NS = public_egress.builds_namespace(public_egress.DEFAULT_PLATFORM_NAMESPACE)


@pytest.fixture
def opted_in(monkeypatch):
    """The policy pack runs for the test stack file (its config as the engine passes it)."""
    monkeypatch.setenv("PULUMI_CONFIG", json.dumps(stacks.read("test").values))
    monkeypatch.setenv("PULUMI_STACK", "test")
    assert public_egress.opt_in(stacks.read("test").values, "test") == public_egress.OptIn(BUILDS_NS, (443,))


def pack(spec: dict, namespace: str = BUILDS_NS, name: str = public_egress.POLICY) -> list[str]:
    return check_resource(rules.no_open_network_peers, *network_policy(name, spec, namespace))


def test_the_pack_accepts_the_opted_in_rule_only_where_it_belongs(opted_in):
    assert pack(egress_spec(public_rule())) == []
    assert pack(egress_spec({"to": public_egress.peers(["203.0.113.0/28"]), "ports": [{"port": 443}]})) == []
    # Anywhere else, or not exactly the rule, it is refused:
    refused = {
        "another namespace": pack(egress_spec(public_rule()), namespace="shop-test"),
        "another policy": pack(egress_spec(public_rule()), name="allow-internet"),
        "a port not opted": pack(egress_spec(public_rule((443, 80)))),
        "a port range": pack(egress_spec({**public_rule(), "ports": [{"port": 443, "endPort": 8443}]})),
        "no ports": pack(egress_spec({"to": public_egress.peers()})),
        "no except": pack(egress_spec({"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"port": 443}]})),
        "metadata reachable": pack(egress_spec({"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": [
            c for c in public_egress.NON_PUBLIC_IPV4 if c != "169.254.0.0/16"]}}], "ports": [{"port": 443}]})),
        "ULA reachable": pack(egress_spec({"to": [{"ipBlock": {"cidr": "::/0", "except": ["fe80::/10"]}}],
                                           "ports": [{"port": 443}]})),
        "every pod too": pack(egress_spec({**public_rule(), "to": [*public_egress.peers(), {"namespaceSelector": {}}]})),
        "ingress": pack({"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [
            {"from": public_egress.peers(), "ports": [{"port": 443}]}]}),
    }
    for case, violations in refused.items():
        assert violations, case
    assert "169.254.0.0/16" in refused["metadata reachable"][0]
    assert "port" in refused["a port not opted"][0] and "publicEgress.ports" in refused["a port not opted"][0]


def test_the_pack_refuses_the_rule_without_the_opt_in(monkeypatch):
    for stack, values in (("test", edited_test_stack(builds={"egress": MIRRORS})), ("prod", stacks.read("prod").values),
                          ("test", edited_test_stack(builds={"publicEgress": {"enabled": False}, "mode": "local"}))):
        monkeypatch.setenv("PULUMI_CONFIG", json.dumps(values))
        monkeypatch.setenv("PULUMI_STACK", stack)
        assert pack(egress_spec(public_rule())), stack
    # A prod stack's config saying it anyway (config validation refuses it first) opens nothing either.
    platform = json.loads(stacks.read("prod").values["cloudstation:platform"])
    assert public_egress.opt_in({"cloudstation:platform": json.dumps(
        {**platform, "builds": {"publicEgress": {"enabled": True}}})}, "prod") is None


def test_the_checks_refuse_every_address_without_the_builds_allowance():
    spec = egress_spec(public_rule())
    assert checks.open_peer_violations("build-egress", spec) != []
    assert checks.open_peer_violations("build-egress", spec, public_egress_ports=(443,)) == []
    assert checks.open_peer_violations("build-egress", egress_spec(
        {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"port": 443}]}), public_egress_ports=(443,)) != []


# --- one definition, shared ------------------------------------------------------------------------


def test_the_pack_side_definitions_match_the_program():
    platform = stack_config.PlatformConfig()
    assert public_egress.DEFAULT_PLATFORM_NAMESPACE == platform.namespace
    assert public_egress.builds_namespace("team-a") == stack_config.PlatformConfig(namespace="team-a").builds_namespace
    assert list(public_egress.DEFAULT_PORTS) == build_job.PublicEgress().ports
    assert public_egress.POLICY == builds_namespace.EGRESS_POLICY
    # Both families: the repository accepts IPv6 blocks everywhere (components/network.py Cidr), and a
    # dual-stack node resolves docker.io and GitHub to either.
    assert [p["ipBlock"]["cidr"] for p in public_egress.peers()] == ["0.0.0.0/0", "::/0"]
    for block in [*public_egress.NON_PUBLIC_IPV4, *public_egress.NON_PUBLIC_IPV6]:
        net = ipaddress.ip_network(block)
        # Python's ipaddress calls multicast and the IPv4-embedding prefixes global; they are excepted
        # for what they reach (multicast: no TCP; NAT64 and 6to4: any IPv4 address, private ones too).
        embedding = ("224.0.0.0/3", "ff00::/8", "64:ff9b::/96", "64:ff9b:1::/48", "2002::/16")
        assert not net.network_address.is_global or block in embedding, block
