"""Address lists that open a flow to (nearly) every address, however they are split (issue 20 finding 5).

`[0.0.0.0/1, 128.0.0.0/1]` is 0.0.0.0/0 in two halves; a list of scattered /8s that never merge
reaches as much of the internet. One definition (infra/address_blocks.py) says when a list is open;
the config (every address list a stack file accepts), the checks of the rendered graph
(cloudstation_tools/checks.py) and the policy pack (policy/rules.py) all apply it.
"""
from __future__ import annotations

import json

import pytest

from cloudstation_tools import checks
from infra import config as stack_config
from policy import rules
from tests.test_armada_workers import PLATFORM, main_with, refused, worker_with
from tests.test_policy import check_resource, check_stack, network_policy, registry_graph

SPLIT_V4 = ["0.0.0.0/1", "128.0.0.0/1"]
SPLIT_V6 = ["::/1", "8000::/1"]
SCATTERED = ["11.0.0.0/8", "13.0.0.0/8", "15.0.0.0/8"]
"""Three public /8s that never merge: 48 million public addresses, three times what one /8 holds."""
PRIVATE = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]
"""Every RFC 1918 block: wide, but none public and none wider than /8."""
PG_SECRET = {"namespace": "ops", "name": "pg"}


def minimal_stack(platform: dict) -> dict:
    """A test stack with one small project (builds may pull from public addresses) and `platform`."""
    return {
        "cloudstation:environment": "test",
        "cloudstation:platform": {"builds": {"publicEgress": {"enabled": True}}, **platform},
        "cloudstation:projects": [
            {"name": "p", "entities": [{"name": "e", "kind": "action", "language": "go", "source": "x"}]}
        ],
    }


def problems(platform: dict) -> list[str]:
    with pytest.raises(stack_config.ConfigError) as error:
        stack_config.load(minimal_stack(platform))
    return error.value.problems


# --- the one definition ----------------------------------------------------------------------------


@pytest.mark.parametrize("blocks, reason", [
    (["0.0.0.0/0"], "every IPv4 address"),
    (SPLIT_V4, "every IPv4 address"),
    (["0.0.0.0/2", "64.0.0.0/2", "128.0.0.0/2", "192.0.0.0/2"], "every IPv4 address"),
    (SPLIT_V6, "every IPv6 address"),
    (["10.0.0.0/7"], "wider than /8"),
    (["10.0.0.0/8", "11.0.0.0/8"], "wider than /8"),  # they merge into 10.0.0.0/7
    (SCATTERED, "public IPv4 addresses"),
    (["2001:db8::/31"], "wider than /32"),
    (["2a00::/33", "2a01::/33", "2a02::/33"], "public IPv6 addresses"),
    # IPv6 blocks that carry IPv4 addresses: Go's net.IPNet (and so CNIs written in Go) reads
    # ::ffff:0:0/96 as 0.0.0.0/0 for an IPv4 address; NAT64's prefix reaches all of IPv4 through the gateway.
    (["::ffff:0:0/96"], "every IPv4 address"),
    (["64:ff9b::/96"], "every IPv4 address"),
    (["::/64"], "every IPv4 address"),  # contains ::ffff:0:0/96
    (["::ffff:0:0/97", "::ffff:128.0.0.0/97"], "every IPv4 address"),
])
def test_a_list_is_open_when_its_union_is(blocks, reason):
    from infra import address_blocks

    found = address_blocks.open_reason(blocks)
    assert found is not None and reason in found, (blocks, found)


@pytest.mark.parametrize("blocks", [
    [], ["172.18.0.0/16"], ["10.0.0.0/8"], ["11.0.0.0/8"], PRIVATE, [*PRIVATE, "100.64.0.0/10", "203.0.113.0/24"],
    ["2001:db8::/32"], ["fd00:10:244::/56", "2001:db8:10::/64"], ["::ffff:10.0.0.0/104"], ["10.0.0.5/32", "::1/128"],
])
def test_named_networks_are_not_open(blocks):
    from infra import address_blocks

    assert address_blocks.open_reason(blocks) is None


# --- config: every address list a stack file accepts -------------------------------------------------


@pytest.mark.parametrize("platform, key, blocks, expected", [
    ({"kubernetesApi": {"cidrs": SPLIT_V4}}, "platform.kubernetesApi.cidrs", SPLIT_V4,
     ["every IPv4 address", "allowAnyAddress: true"]),
    ({"kubernetesApi": {"cidrs": SCATTERED}}, "platform.kubernetesApi.cidrs", SCATTERED, ["public IPv4 addresses"]),
    ({"kubernetesApi": {"cidrs": ["::ffff:0:0/96"]}}, "platform.kubernetesApi.cidrs", ["::ffff:0:0/96"],
     ["every IPv4 address"]),
    ({"armada": {"userAccess": {"cidrs": SPLIT_V6}}}, "platform.armada.userAccess.cidrs", SPLIT_V6,
     ["every IPv6 address", "allowAnySource: true"]),
    ({"armada": {"userAccess": {"cidrs": ["10.0.0.0/7"]}}}, "platform.armada.userAccess.cidrs", ["10.0.0.0/7"],
     ["wider than /8"]),
    ({"registry": {"nodeCidrs": SPLIT_V4}}, "platform.registry.nodeCidrs", SPLIT_V4, ["every IPv4 address"]),
    ({"registry": {"nodeCidrs": ["0.0.0.0/0"]}}, "platform.registry.nodeCidrs", ["0.0.0.0/0"], ["every IPv4 address"]),
    ({"registry": {"loadBalancer": True, "loadBalancerSourceRanges": SPLIT_V4}},
     "platform.registry.loadBalancerSourceRanges", SPLIT_V4, ["every IPv4 address"]),
    ({"builds": {"publicEgress": {"enabled": True}, "egress": [{"hosts": ["nexus.example.com"], "cidrs": SPLIT_V4}]}},
     "platform.builds.egress[0].cidrs", SPLIT_V4, ["every IPv4 address", "platform.builds.publicEgress"]),
    ({"stores": {"postgres": {"mode": "external", "host": "db.example.com", "cidrs": SPLIT_V4,
                              "credentialsSecret": PG_SECRET}}},
     "platform.stores.postgres.cidrs", SPLIT_V4, ["every IPv4 address", "allowAnyAddress: true"]),
    ({"armada": {"redis": {"mode": "external", "host": "redis.example.com", "existingSecret": "redis",
                           "cidrs": SCATTERED}}},
     "platform.armada.redis.cidrs", SCATTERED, ["public IPv4 addresses"]),
    ({"stores": {"backups": {"target": "s3", "s3": {
        "endpoint": "https://s3.example.com", "bucket": "backups", "credentialsSecret": PG_SECRET, "cidrs": SPLIT_V4}}}},
     "platform.stores.backups.s3.cidrs", SPLIT_V4, ["every IPv4 address"]),
], ids=lambda v: v if isinstance(v, str) and v.startswith("platform.") else None)
def test_every_config_key_refuses_a_split_of_every_address(platform, key, blocks, expected):
    found = problems(platform)
    assert len(found) == 1, found
    [problem] = found
    assert problem.startswith(f"cloudstation:{key}: {json.dumps(blocks)} — "), problem
    for text in expected:
        assert text in problem, problem
    assert "/8" in problem and "/32" in problem, problem  # what is allowed


def test_named_networks_and_wide_excepts_load():
    config = stack_config.load(minimal_stack({
        "kubernetesApi": {"cidrs": PRIVATE},
        "registry": {"nodeCidrs": PRIVATE},
        "armada": {"userAccess": {"cidrs": ["203.0.113.0/24", "2001:db8::/32"]}},
        # An except narrows the public-egress rule: however wide, it opens nothing.
        "builds": {"publicEgress": {"enabled": True, "exceptCidrs": ["0.0.0.0/1", "2000::/4"]}},
    }))
    assert [str(c) for c in config.platform.kubernetes_api.cidrs] == PRIVATE


def test_workers_and_the_remote_scheduler_refuse_a_split():
    message = refused(*main_with(lambda a: a["workers"][0].update(cidrs=SPLIT_V4)))
    assert f"cloudstation:platform.armada.workers[0].cidrs: {json.dumps(SPLIT_V4)} — " in message, message
    assert "every IPv4 address" in message
    # Every worker's CIDRs become one rule (and one loadBalancerSourceRanges): their union is checked too.
    def one_public_slash_8_each(armada: dict) -> None:
        first = armada["workers"][0]
        armada["workers"] = [{**first, "cidrs": [SCATTERED[0]]},
                             {**first, "name": "second", "clusterId": "second", "cidrs": [SCATTERED[1]]}]
    message = refused(*main_with(one_public_slash_8_each))
    assert message.count("\n") == 1, message
    assert "cloudstation:platform.armada.workers: " in message and "public IPv4 addresses" in message, message
    message = refused(*worker_with(lambda d: d[PLATFORM]["armada"]["remoteScheduler"].update(cidrs=SPLIT_V6)))
    assert f"cloudstation:platform.armada.remoteScheduler.cidrs: {json.dumps(SPLIT_V6)} — " in message, message


# --- the rendered graph and the policy pack --------------------------------------------------------------


def egress(*cidrs: str) -> dict:
    return {"podSelector": {}, "policyTypes": ["Egress"],
            "egress": [{"to": [{"ipBlock": {"cidr": c}} for c in cidrs], "ports": [{"port": 443}]}]}


@pytest.mark.parametrize("cidrs", [SPLIT_V4, SPLIT_V6, SCATTERED, ["::ffff:0:0/96"], ["10.0.0.0/7"]],
                         ids=["split v4", "split v6", "scattered", "mapped", "wide"])
def test_the_checks_and_the_pack_refuse_a_split_rule(cidrs):
    [problem] = checks.open_peer_violations("leak", egress(*cidrs))
    assert problem.startswith("leak egress[0]: "), problem
    assert all(c in problem for c in cidrs), problem
    assert check_resource(rules.no_open_network_peers, *network_policy("leak", egress(*cidrs)))
    # The stack's opt-in (allowAnyAddress), passed to the pack, still admits it.
    assert checks.open_peer_violations("leak", egress(*cidrs), allow_any_address=True) == []


def test_the_checks_admit_named_networks():
    assert checks.open_peer_violations("ok", egress(*PRIVATE, "203.0.113.0/24", "fd00:10:244::/56")) == []


def test_the_pack_refuses_a_split_registry_load_balancer_range():
    allowed = {"allowRegistryExposure": True}
    assert check_stack(rules.registry_not_exposed,
                       registry_graph("LoadBalancer", loadBalancerSourceRanges=["203.0.113.0/24"]), allowed) == []
    [violation] = check_stack(rules.registry_not_exposed,
                              registry_graph("LoadBalancer", loadBalancerSourceRanges=SPLIT_V4), allowed)
    assert "every IPv4 address" in violation, violation
