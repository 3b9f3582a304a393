"""Stack-file mistakes the config model now names (issue 21, "Why"), each with the key, the value and
the fix, every one at once; and where a problem's key is written in the file (infra/stack_yaml.py
KeyLines), which `cloudstation check` reports as file:line."""
from __future__ import annotations

import json

import pytest

from infra import config, stack_yaml
from tests.test_config import problems_of, raw

TEXT = """\
# a comment
config:
  cloudstation:environment: test
  cloudstation:config:kubernetes: {}
  cloudstation:platform:
    namespace: cloudstation
    registry:
      mode: managed
      storage: {size: 20Gi}
  cloudstation:platform.registry.nodePort: 32001
  cloudstation:projects:
    - name: shop
      entities:
        - name: cart
          kind: evented
        - name: likes
          kind: replicated
"""


def test_key_lines_find_each_key_as_written():
    lines = stack_yaml.KeyLines(TEXT, "Pulumi.test.yaml")
    assert lines.line("cloudstation:environment") == 3
    assert lines.line("cloudstation:kubernetes.context") == 4  # old `:config:` spelling; context not written
    assert lines.line("cloudstation:platform.namespace") == 6
    assert lines.line("cloudstation:platform.registry.storage.size") == 9  # flow mapping
    assert lines.line("cloudstation:platform.registry (registryPassword)") == 7
    assert lines.line("cloudstation:platform.registry.nodePort") == 10  # the flat key itself
    assert lines.line("cloudstation:projects[0].entities[0].kind") == 15
    assert lines.line("cloudstation:projects[0].entities[1]") == 16
    assert lines.line("cloudstation:projects[0].entities[5].kind") == 13  # beyond the list: the list
    assert lines.line("cloudstation:projects[*].entities[*].image") == 11
    assert lines.line("cloudstation:platform.stores.postgres.mode") == 5  # a default: its section
    assert lines.line("cloudstation:armada") is None
    assert stack_yaml.KeyLines("config: [", "x").line("cloudstation:environment") is None


def test_a_flat_key_says_to_use_path():
    values = raw()
    values["cloudstation:platform.registry.nodePort"] = "32001"
    [problem] = problems_of(values)
    assert problem.startswith("cloudstation:platform.registry.nodePort: 32001 — a flat key"), problem
    assert "pulumi config rm 'cloudstation:platform.registry.nodePort'" in problem
    assert "pulumi config set --path 'cloudstation:platform.registry.nodePort' 32001" in problem
    values = raw()
    values["cloudstation:projects[0].entities[0].replicas"] = "2"
    [problem] = problems_of(values)
    assert "a flat key" in problem and "--path 'cloudstation:projects[0].entities[0].replicas'" in problem


@pytest.mark.parametrize("key, meant", [
    ("cloudstaton:kubernetes", "cloudstation:kubernetes"),
    ("CloudStation:environment", "cloudstation:environment"),
    ("cloudstation-prod:platform", "cloudstation:platform"),
])
def test_a_namespace_close_to_ours_is_refused_with_did_you_mean(key, meant):
    values = raw()
    values[key] = json.dumps({"context": "kind-prod"})
    [problem] = problems_of(values)
    assert problem.startswith(f"{key}: not read — ") and f"did you mean '{meant}'?" in problem, problem


def test_a_namespace_close_to_kubernetes_names_our_key():
    values = raw()
    values["kubernets:context"] = "kind-prod"
    [problem] = problems_of(values)
    assert problem.startswith("kubernets:context: not read — ") and "cloudstation:kubernetes.context" in problem


def test_other_namespaces_stay_allowed():
    values = raw()
    values.update({"aws:region": "eu-west-1", "pulumi:tags": "{}", "docker:host": "x", "myteam:owner": "me"})
    assert config.load(values).environment is config.Environment.TEST


def test_a_request_above_its_limit_is_refused_for_cpu_and_memory_at_once():
    platform = {"builds": {"publicEgress": {"enabled": True}},
                "registry": {"resources": {"cpuRequest": "2", "cpuLimit": "1", "memoryRequest": "1Gi",
                                           "memoryLimit": "512Mi"}}}
    problems = problems_of(raw(platform=platform))
    assert problems == [
        "cloudstation:platform.registry.resources.cpuRequest: '2' — more than cpuLimit '1': the API server refuses "
        "a container whose request exceeds its limit; lower the request or raise the limit",
        "cloudstation:platform.registry.resources.memoryRequest: '1Gi' — more than memoryLimit '512Mi': the API "
        "server refuses a container whose request exceeds its limit; lower the request or raise the limit",
    ]
    platform["registry"]["resources"] = {"cpuRequest": "1000m", "cpuLimit": "1", "memoryRequest": "1024Mi",
                                         "memoryLimit": "1Gi"}
    config.load(raw(platform=platform))  # equal is fine


def test_an_external_postgres_names_everything_it_needs_at_once():
    platform = {"builds": {"publicEgress": {"enabled": True}},
                "stores": {"postgres": {"mode": "external", "host": "pg.example.com", "storage": {"size": "1Gi"}}}}
    problems = problems_of(raw(platform=platform))
    assert [p.split(":", 2)[1].split(" ")[0].split(".", 3)[-1] for p in problems] == [
        "storage", "credentialsSecret", "cidrs"], problems


def test_the_cluster_budget_is_a_setting_of_the_owner_stack():
    default = config.load(raw()).platform.cluster_budget
    assert (default.cpu, default.memory) == ("3", "6Gi")  # the example cluster: one node of 4 CPU, 8 GiB
    platform = {"builds": {"publicEgress": {"enabled": True}}, "clusterBudget": {"cpu": 12, "memory": "40Gi"}}
    assert config.load(raw(platform=platform)).platform.cluster_budget.cpu == "12"
    shared = {"ownsClusterResources": False, "armada": {"enabled": False}, "clusterBudget": {"cpu": "8"},
              "projectState": {"image": "localhost:32000/platform/project-state@sha256:" + "b" * 64}}
    [problem] = problems_of(raw(environment="prod", platform=shared, projects=[]) | {
        "cloudstation:projects": json.dumps([{"name": "shop", "entities": [
            {"name": "cart", "kind": "action", "language": "javascript", "source": "entities/shop/cart",
             "image": "localhost:32000/shop/cart@sha256:" + "a" * 64}]}])})
    assert problem.startswith("cloudstation:platform.clusterBudget: ") and "Pulumi.test.yaml" in problem, problem
