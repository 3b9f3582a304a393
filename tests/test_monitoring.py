"""Monitoring (`platform.monitoring`, docs/monitoring.md), checked on rendered stacks with it on:
the test stack file with `monitoring.enabled: true`, and prod on a cluster of its own as
docs/armada.md's prod-size example writes it (tests/stacks/). Every expectation is
derived from the rendered objects: which Armada services, stores and entity namespaces exist,
which ports their containers name and what their configs say. With monitoring off (the example
stack files), nothing of it is rendered."""
from __future__ import annotations

import copy
import hashlib
import json
import re
from pathlib import Path
from typing import Iterator

import promql_parser
import pytest
import yaml

from components import exporters, monitoring, network
from components.monitoring import METRICS, MonitoringConfig, known_metric
from components.project_environment import SERVICE_LABEL
from infra import config as stack_config
from cloudstation_tools import checks, render, validate
from tests import stacks, unpinned
from tests.stacks import OWN_CLUSTER, rendered as variant
from tests.conftest import ROOT, objects, spec_violations
from tests.test_network_policies import Pod, cluster_of, entity_pods

MONITORED = stacks.MONITORED
STACKS = [MONITORED, OWN_CLUSTER]
PROMETHEUS = Pod("monitoring", "prometheus-k8s-0", {"app.kubernetes.io/name": "prometheus", "prometheus": "k8s"}, {})
IMPOSTOR = Pod("monitoring", "grafana-0", {"app.kubernetes.io/name": "grafana"}, {})
"""Another pod of Prometheus' namespace: it must not reach the metrics ports."""


def stack(name: str) -> render.Rendered:
    return stacks.rendered(name)


@pytest.fixture(params=STACKS)
def monitored(request) -> render.Rendered:
    return stack(request.param)


def settings_of(rendered: render.Rendered) -> MonitoringConfig:
    from tests.stacks import config_of

    if rendered is stack(MONITORED):
        return MonitoringConfig(enabled=True)
    return config_of(rendered).platform.monitoring


def cluster_with_prometheus(rendered: render.Rendered):
    """The rendered stack alone in a cluster (tests/test_network_policies.py's model), with a
    Prometheus pod and another pod in Prometheus' namespace."""
    cluster = cluster_of({"stack": rendered})
    cluster.namespaces.setdefault(PROMETHEUS.namespace, {network.NAMESPACE_LABEL: PROMETHEUS.namespace})
    cluster.pods += [PROMETHEUS, IMPOSTOR]
    return cluster


def selects(selector: dict, labels: dict) -> bool:
    return checks.selects(selector, labels)


def monitors(rendered: render.Rendered, namespace: str) -> list[dict]:
    return [m for m in objects(rendered, "PodMonitor") if m["metadata"]["namespace"] == namespace]


def scraped(rendered: render.Rendered, namespace: str, labels: dict, ports: dict[str, int]) -> list[tuple[dict, int]]:
    """(PodMonitor, port number) of every monitor endpoint scraping a pod with `labels` and named
    container `ports` in `namespace`."""
    found = []
    for monitor in monitors(rendered, namespace):
        if selects(monitor["spec"]["selector"], labels):
            for endpoint in monitor["spec"]["podMetricsEndpoints"]:
                if endpoint["port"] in ports:
                    found.append((monitor, ports[endpoint["port"]]))
    return found


def named_ports(workload: dict) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for c in checks.pod_spec(workload)["containers"] for p in c.get("ports", [])}


def template_labels(workload: dict) -> dict:
    return checks.pod_template(workload)["metadata"]["labels"]


def rules(rendered: render.Rendered) -> Iterator[tuple[dict, dict]]:
    """(PrometheusRule, rule) of every alerting rule."""
    for resource in objects(rendered, "PrometheusRule"):
        for group in resource["spec"]["groups"]:
            for rule in group["rules"]:
                yield resource, rule


def alerts(rendered: render.Rendered, namespace: str, name: str) -> list[dict]:
    return [r for res, r in rules(rendered) if res["metadata"]["namespace"] == namespace and r["alert"] == name]


def armada_namespace(rendered: render.Rendered) -> str:
    return rendered.outputs["armadaNamespace"]


def entity_namespaces(rendered: render.Rendered) -> list[str]:
    return [rendered.outputs["projectStateNamespace"], *rendered.outputs["projectNamespaces"].values()]


def armada_services(rendered: render.Rendered) -> list[dict]:
    """Every Deployment running an Armada image."""
    return [d for d in objects(rendered, "Deployment")
            if any("gresearch/armada-" in c["image"] for c in checks.pod_spec(d)["containers"])]


def configured_metrics_port(config: dict) -> int:
    """The port an Armada service's config says its metrics server listens on (v0.22.7 struct
    fields: `metricsPort` for most services, `metrics.port` for the scheduler, `metric.port` for
    the executor)."""
    for path in (("metricsPort",), ("metrics", "port"), ("metric", "port")):
        value = config
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, int):
            return value
    raise AssertionError(f"no metrics port in {sorted(config)}")


def vector_selectors(expr: str) -> list:
    found = []

    def visit(node):
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def unknown_metrics(expr: str) -> list[str]:
    """Metric names `expr` selects that METRICS does not list (raises ValueError if it does not parse)."""
    return [s.name for s in vector_selectors(expr) if not known_metric(s.name)]


def matchers(selector) -> dict[str, tuple[str, str]]:
    return {m.name: (str(m.op).rsplit(".", 1)[-1], m.value) for m in selector.matchers.matchers}


# --- what is scraped -------------------------------------------------------------------------------


def test_every_armada_service_is_scraped_on_its_real_metrics_port(monitored):
    namespace = armada_namespace(monitored)
    services = armada_services(monitored)
    assert len(services) >= 7  # server, scheduler, three ingesters, lookout, an executor
    for deployment in services:
        name = deployment["metadata"]["name"]
        ports = named_ports(deployment)
        found = scraped(monitored, namespace, template_labels(deployment), ports)
        assert [port for _, port in found] == [ports["metrics"]], name
        # The port the process listens on: the override config it mounts (the default file's where
        # it sets none), never a guess.
        config_map = [o for o in objects(monitored, "ConfigMap") if o["metadata"]["namespace"] == namespace
                      and o["metadata"]["name"] == name]
        [config_map] = config_map
        config = yaml.safe_load(config_map["data"]["application_config.yaml"])
        assert configured_metrics_port(config) == ports["metrics"], name


@pytest.mark.parametrize("service, key", [
    ("server", "metricsPort"), ("scheduler", "metrics.port"), ("executor", "metric.port"), ("lookout", "metricsPort"),
    ("lookoutingester", "metricsPort"), ("eventingester", "metricsPort"), ("binoculars", "metricsPort"),
])
def test_the_metrics_ports_are_upstreams_defaults_where_the_reference_has_them(service, key):
    """Against Armada v0.22.7's built-in defaults (config/<service>/config.yaml, recorded in
    tests/upstream/ by scripts/armada-config-keys.py): the ports components/armada/config.py
    writes are the images' own."""
    from tests.test_armada_config import default_value
    from components.armada import config as armada_config

    ours = {"server": armada_config.SERVER_PORTS, "scheduler": armada_config.SCHEDULER_PORTS,
            "executor": armada_config.EXECUTOR_PORTS, "lookout": armada_config.LOOKOUT_PORTS,
            "lookoutingester": armada_config.LOOKOUT_INGESTER_PORTS, "eventingester": armada_config.EVENT_INGESTER_PORTS,
            "binoculars": armada_config.BINOCULARS_PORTS}[service]["metrics"]
    assert ours == default_value(service, key)


def test_the_registry_serves_metrics_on_its_debug_port_and_is_scraped_there(monitored):
    registries = [d for d in objects(monitored, "Deployment")
                  if any("library/registry" in c["image"] for c in checks.pod_spec(d)["containers"])]
    if stack_config_of(monitored).platform.registry.mode != "managed":
        assert registries == []  # an external registry is not this stack's to scrape
        return
    [registry] = registries
    namespace = registry["metadata"]["namespace"]
    [config_map] = [o for o in objects(monitored, "ConfigMap")
                    if o["metadata"]["namespace"] == namespace and "config.yml" in (o.get("data") or {})]
    debug = yaml.safe_load(config_map["data"]["config.yml"])["http"]["debug"]
    assert debug["prometheus"] == {"enabled": True, "path": "/metrics"}
    ports = named_ports(registry)
    [(monitor, port)] = scraped(monitored, namespace, template_labels(registry), ports)
    assert port == int(debug["addr"].rsplit(":", 1)[1])
    assert monitor["spec"]["podMetricsEndpoints"][0]["path"] == debug["prometheus"]["path"]
    # The debug port carries metrics and health only to Prometheus and the kubelet: no other scrape peer.
    cluster = cluster_with_prometheus(monitored)
    pod = cluster.pod(namespace, registry["metadata"]["name"])
    assert cluster.allowed(PROMETHEUS, pod, port)
    assert not cluster.allowed(IMPOSTOR, pod, port) and not cluster.allowed(cluster.pod("default", "stranger"), pod, port)


def stack_config_of(rendered: render.Rendered) -> stack_config.StackConfig:
    from tests.stacks import config_of

    return config_of(rendered)


def test_every_entity_proxy_is_scraped_on_port_9090(monitored):
    proxies = [p for p in entity_pods(monitored.manifests())]
    assert {p.namespace for p in proxies} == set(entity_namespaces(monitored))
    for pod in proxies:
        found = scraped(monitored, pod.namespace, pod.labels, pod.ports)
        assert [port for _, port in found] == [9090], pod.name


def test_every_managed_store_has_an_exporter_connected_to_it_and_scraped(monitored):
    stores = [s for s in objects(monitored, "StatefulSet")
              if any(re.search(r"/library/(postgres|redis):", c["image"]) for c in checks.pod_spec(s)["containers"])]
    assert {s["metadata"]["namespace"] for s in stores} >= {armada_namespace(monitored)}
    deployments = objects(monitored, "Deployment")
    secrets = objects(monitored, "Secret")
    for store in stores:
        namespace, name = store["metadata"]["namespace"], store["metadata"]["name"]
        kind = "postgres" if any("/library/postgres:" in c["image"] for c in checks.pod_spec(store)["containers"]) else "redis"
        host = f"{name}.{namespace}.svc.cluster.local"
        matching = []
        for deployment in deployments:
            if deployment["metadata"]["namespace"] != namespace:
                continue
            [container] = checks.pod_spec(deployment)["containers"]
            env = {e["name"]: e for e in container.get("env", [])}
            address = (env.get("DATA_SOURCE_URI") or env.get("REDIS_ADDR") or {}).get("value", "")
            if re.match(rf"^(redis://)?{re.escape(host)}:", address):
                matching.append((deployment, container, env))
        assert len(matching) == 1, f"{namespace}/{name}: exporters {len(matching)}"
        deployment, container, env = matching[0]
        assert {"postgres": "/postgres-exporter:", "redis": "/redis_exporter:"}[kind] in container["image"]
        # Its credentials come from the store's own Secret, which has the keys it reads.
        for variable in ("DATA_SOURCE_USER", "DATA_SOURCE_PASS") if kind == "postgres" else ("REDIS_PASSWORD",):
            ref = env[variable]["valueFrom"]["secretKeyRef"]
            [secret] = [s for s in secrets if s["metadata"]["namespace"] == namespace and s["metadata"]["name"] == ref["name"]]
            assert ref["key"] in {**(secret.get("data") or {}), **(secret.get("stringData") or {})}, (name, variable)
        # It reaches the store (its egress and the store's ingress), and Prometheus reaches it.
        cluster = cluster_with_prometheus(monitored)
        exporter = cluster.pod(namespace, deployment["metadata"]["name"])
        server = cluster.pod(namespace, name)
        assert cluster.allowed(exporter, server, next(iter(named_ports(store).values())))
        ports = named_ports(deployment)
        [(_, port)] = scraped(monitored, namespace, template_labels(deployment), ports)
        assert cluster.allowed(PROMETHEUS, exporter, port)
        assert not cluster.allowed(exporter, cluster.pod("kube-system", "coredns"), 80)


def test_every_statefulset_of_a_monitored_namespace_has_a_readiness_alert(monitored):
    watched = {r["metadata"]["namespace"] for r in objects(monitored, "PrometheusRule")}
    for store in objects(monitored, "StatefulSet"):
        namespace, name = store["metadata"]["namespace"], store["metadata"]["name"]
        if namespace not in watched:
            continue
        named = [r for r in alerts(monitored, namespace, "CloudStationStoreNotReady") if f'statefulset="{name}"' in r["expr"]]
        assert len(named) == 1, f"{namespace}/{name}"


# --- network: only Prometheus, only the metrics ports -------------------------------------------------


def test_only_prometheus_reaches_the_metrics_ports(monitored):
    cluster = cluster_with_prometheus(monitored)
    impostor = IMPOSTOR
    settings = settings_of(monitored)
    checked = 0
    for monitor in objects(monitored, "PodMonitor"):
        namespace = monitor["metadata"]["namespace"]
        [endpoint] = monitor["spec"]["podMetricsEndpoints"]
        pods = [p for p in cluster.pods if p.namespace == namespace and selects(monitor["spec"]["selector"], p.labels)]
        assert pods, monitor["metadata"]["name"]
        for pod in pods:
            port = pod.ports[endpoint["port"]]
            assert cluster.allowed(PROMETHEUS, pod, port), (pod.name, port)
            assert not cluster.allowed(impostor, pod, port), pod.name
            assert not cluster.allowed(cluster.pod("default", "stranger"), pod, port), pod.name
            checked += 1
    assert checked
    # The scrape policies admit exactly Prometheus' pods on exactly the monitored ports.
    for policy in objects(monitored, "NetworkPolicy"):
        if not policy["metadata"]["name"].endswith("-scrape"):
            continue
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        for rule in policy["spec"]["ingress"]:
            assert rule["from"] == list(settings.scrapers()), policy["metadata"]["name"]


def test_a_scrape_peer_must_name_namespace_and_pods():
    with pytest.raises(ValueError):
        network.scrape_ingress({"matchLabels": {"a": "b"}}, [9000], [{"namespaceSelector": {}}])
    with pytest.raises(ValueError):
        network.scrape_ingress({"matchLabels": {"a": "b"}}, [9000], [network.namespace_peer("monitoring")])
    with pytest.raises(ValueError):
        network.scrape_ingress({"matchLabels": {"a": "b"}}, [9000], [])  # no rule without peers


def test_a_scrape_peer_naming_prometheus_pods_but_no_namespace_is_refused():
    """Issue 20 finding 11: each case above also lacks pod labels, so none fails for the namespace
    alone. Pods without a namespaceSelector are the policy's own namespace's (any pod there carrying
    Prometheus' labels, e.g. a tenant's); an empty namespaceSelector is every namespace's."""
    labels = {"app.kubernetes.io/name": "prometheus"}
    for peer in (network.pods(labels), {"namespaceSelector": {}, "podSelector": {"matchLabels": labels}}):
        with pytest.raises(ValueError, match="a scrape peer names Prometheus' namespace and pod labels"):
            network.scrape_ingress({"matchLabels": {"a": "b"}}, [9000], [peer])
    # What monitoring.py renders names both, and passes.
    scrapers = list(MonitoringConfig(enabled=True, prometheusPodLabels=labels).scrapers())
    assert network.scrape_ingress({"matchLabels": {"a": "b"}}, [9000], scrapers)["ingress"][0]["from"] == scrapers


def test_bad_monitoring_config_is_a_clear_error():
    base = stacks.with_monitoring({
        "enabled": True, "prometheusPodLabels": {}, "scrapeInterval": "soon", "resourceLabels": {"bad key!": "x"}})
    with pytest.raises(stack_config.ConfigError) as error:
        stacks.load(base.values)
    message = str(error.value)
    for key in ("platform.monitoring.prometheusPodLabels", "platform.monitoring.scrapeInterval",
                "platform.monitoring.resourceLabels"):
        assert f"cloudstation:{key}" in message, message


# --- custom resources against the operator's CRDs -----------------------------------------------------


def test_the_custom_resources_validate_against_the_vendored_crds(monitored):
    mine = [o for o in monitored.manifests() if o["apiVersion"] == monitoring.API_VERSION]
    assert {o["kind"] for o in mine} == {"PodMonitor", "PrometheusRule"}
    assert validate.validate_all(mine) == []
    # The validation is real: a misspelt field and a bad duration are caught.
    bad = copy.deepcopy(mine)
    monitor = next(o for o in bad if o["kind"] == "PodMonitor")
    monitor["spec"]["podMetricsEndpoints"][0]["intervall"] = "30s"
    rule = next(o for o in bad if o["kind"] == "PrometheusRule")
    rule["spec"]["groups"][0]["rules"][0]["for"] = "ten minutes"
    problems = validate.validate_all(bad)
    assert any("intervall" in p for p in problems) and any("ten minutes" in p for p in problems), problems


def test_the_vendored_crds_are_the_ones_their_provenance_names():
    directory = ROOT / "components" / "crds"
    text = (directory / "PROVENANCE.md").read_text()
    files = sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*.yaml"))
    assert files
    for name in files:
        digest = hashlib.sha256((directory / name).read_bytes()).hexdigest()
        assert f"{digest}  {name}" in text, name
        assert f"`{name}`" in text and "prometheus-operator/prometheus-operator" in text
        crd = yaml.safe_load((directory / name).read_text())
        assert crd["spec"]["group"] == "monitoring.coreos.com"
    kinds = {yaml.safe_load((directory / n).read_text())["spec"]["names"]["kind"] for n in files}
    assert kinds == {"PodMonitor", "PrometheusRule"}


# --- alerts ------------------------------------------------------------------------------------------


def test_the_alerts_an_operator_acts_on_are_there(monitored):
    namespace = armada_namespace(monitored)
    [not_leasing] = alerts(monitored, namespace, "ArmadaQueueNotLeasing")
    assert {s.name for s in vector_selectors(not_leasing["expr"])} == {"armada_queue_size", "armada_queue_leased_pod_count"}
    [leading] = alerts(monitored, namespace, "ArmadaSchedulerNotLeading")
    assert "armada_scheduler_leader_status" in leading["expr"]
    # One "stopped reporting" alert per executor, on its own container's lease calls.
    executors = [d["metadata"]["name"] for d in armada_services(monitored) if "armada-executor" in
                 checks.pod_spec(d)["containers"][0]["image"]]
    reporting = alerts(monitored, namespace, "ArmadaExecutorNotReporting")
    assert sorted(re.search(r'container="([^"]+)"', r["expr"]).group(1) for r in reporting) == sorted(executors)
    for rule in reporting:
        [calls] = [s for s in vector_selectors(rule["expr"]) if s.name == "grpc_client_handled_total"]
        assert matchers(calls)["grpc_method"] == ("Equal", "LeaseJobRuns")
    # Every Job that must complete before the services start (not the CronJobs' runs) is watched.
    [failed] = alerts(monitored, namespace, "ArmadaMigrationFailed")
    [job_names] = [matchers(s)["job_name"] for s in vector_selectors(failed["expr"])]
    jobs = [j["metadata"]["name"] for j in objects(monitored, "Job") if j["metadata"]["namespace"] == namespace]
    assert job_names[0] == "Re" and set(job_names[1].split("|")) == set(jobs)
    assert [s.name for s in vector_selectors(failed["expr"])] == ["kube_job_failed"]
    # Store down, per exporter.
    exporter_containers = {d["metadata"]["name"] for d in objects(monitored, "Deployment")
                           if d["metadata"]["labels"]["app.kubernetes.io/component"] == exporters.COMPONENT}
    down = [r for _, r in rules(monitored) if r["alert"] == "CloudStationStoreDown"]
    assert {re.search(r'container="([^"]+)"', r["expr"]).group(1) for r in down} == exporter_containers
    # Crash loops (kube-state-metrics restarts) in every namespace with monitored pods.
    for watched in {m["metadata"]["namespace"] for m in objects(monitored, "PodMonitor")}:
        [loop] = alerts(monitored, watched, "CloudStationContainerRestarting")
        assert "kube_pod_container_status_restarts_total" in loop["expr"]
    # The registry's storage (its claim, read from the rendered Deployment).
    for registry in [d for d in objects(monitored, "Deployment") if d["metadata"]["name"] == "registry"]:
        [claim] = [v["persistentVolumeClaim"]["claimName"] for v in checks.pod_spec(registry)["volumes"]
                   if "persistentVolumeClaim" in v]
        full = alerts(monitored, registry["metadata"]["namespace"], "CloudStationRegistryStorageNearlyFull")
        assert full and all(f'persistentvolumeclaim="{claim}"' in r["expr"] for r in full)
        assert {r["labels"]["severity"] for r in full} == {"warning", "critical"}


def test_every_alert_has_a_summary_a_runbook_and_a_severity(monitored):
    seen = 0
    for _, rule in rules(monitored):
        seen += 1
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"].strip(), rule["alert"]
        description = rule["annotations"]["description"]
        # Runbook style: what it means and what to check or run (a command in backticks).
        assert len(description) > 120 and re.search(r"`(kubectl|armadactl|pulumi) [^`]+`", description), rule["alert"]
        assert re.match(r"^[0-9]+[smh]$", rule["for"]), rule["alert"]
    assert seen


def test_every_expression_parses_and_selects_only_cited_metrics_of_its_own_namespace(monitored):
    for resource, rule in rules(monitored):
        namespace = resource["metadata"]["namespace"]
        assert unknown_metrics(rule["expr"]) == [], rule["alert"]
        for selector in vector_selectors(rule["expr"]):
            # Each rule reads its own namespace only (works with an enforcedNamespaceLabel too).
            assert matchers(selector).get("namespace") == ("Equal", namespace), (rule["alert"], selector.name)


def test_the_expression_check_catches_typos_and_unknown_metrics():
    assert unknown_metrics('sum(armada_queue_size{namespace="armada"})') == []
    assert unknown_metrics('sum(armada_queue_sizes{namespace="armada"})') == ["armada_queue_sizes"]
    assert unknown_metrics("histogram_quantile(0.9, rate(armada_scheduler_schedule_cycle_times_bucket[5m]))") == []
    with pytest.raises(ValueError):
        unknown_metrics("sum by (queue (armada_queue_size)")
    with pytest.raises(ValueError):
        unknown_metrics("sum_of(armada_queue_size)")


def test_every_cited_metric_names_its_upstream_source():
    for name, source in METRICS.items():
        assert re.match(r"^[a-z_:][a-z0-9_:]*$", name)
        assert "/" in source or name == "up", name  # a repository path


# --- dashboards --------------------------------------------------------------------------------------


def test_dashboards_are_labelled_for_the_sidecar_and_use_cited_metrics(monitored):
    settings = settings_of(monitored)
    maps = [c for c in objects(monitored, "ConfigMap")
            if (c["metadata"].get("labels") or {}).get("grafana_dashboard") == "1"]
    titles = []
    for config_map in maps:
        assert config_map["metadata"]["namespace"] == settings.dashboards_in
        [(key, text)] = config_map["data"].items()
        assert key.endswith(".json")
        dashboard = json.loads(text)
        titles.append(dashboard["title"])
        assert dashboard["panels"]
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                assert unknown_metrics(target["expr"]) == [], (dashboard["title"], panel["title"])
    assert any(t.startswith("Armada") for t in titles) and any(t.startswith("CloudStation") for t in titles)
    assert len({c["metadata"]["name"] for c in maps}) == len(maps)


# --- workloads ---------------------------------------------------------------------------------------


def test_the_exporters_meet_the_standards_and_are_pinned(monitored):
    from infra import versions

    found = 0
    for deployment in objects(monitored, "Deployment"):
        if deployment["metadata"]["labels"]["app.kubernetes.io/component"] != exporters.COMPONENT:
            continue
        found += 1
        name = f"Deployment {deployment['metadata']['name']}"
        spec = checks.pod_spec(deployment)
        assert spec_violations(name, spec) == []
        assert checks.probe_violations(name, spec, "Deployment") == []
        [container] = spec["containers"]
        assert container["image"] in (versions.image("postgres-exporter"), versions.image("redis-exporter"))
        assert container["readinessProbe"]["httpGet"] and container["livenessProbe"]["httpGet"]
        assert spec["automountServiceAccountToken"] is False
    assert found >= 2


# --- off by default ----------------------------------------------------------------------------------


def test_nothing_monitoring_related_is_rendered_when_it_is_off(rendered):
    manifests = rendered.manifests()
    assert [o for o in manifests if o["apiVersion"].startswith("monitoring.coreos.com/")] == []
    assert [o for o in manifests if (o["metadata"].get("labels") or {}).get("grafana_dashboard")] == []
    assert [o for o in manifests if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/component")
            in (monitoring.COMPONENT, exporters.COMPONENT)] == []
    for config_map in objects(rendered, "ConfigMap"):
        if "config.yml" in (config_map.get("data") or {}):
            assert "prometheus" not in yaml.safe_load(config_map["data"]["config.yml"])["http"]["debug"]
    assert not [r for r in rendered.registrations if r.type.startswith("cloudstation:monitoring:")]


def test_monitoring_is_on_in_the_documented_prod_size_examples():
    """docs/armada.md's own-cluster example (rendered by the tests as `prod-own-cluster`) and
    docs/cloudstate.md's prod sizes turn monitoring on."""
    from tests.stacks import own_cluster_example

    assert own_cluster_example()["cloudstation:platform"]["monitoring"]["enabled"] is True
    text = (ROOT / "docs" / "cloudstate.md").read_text()
    section = text[text.index("## Sizing"):]
    [block] = re.findall(r"```yaml\n(.*?)```", section[:section.index("\n## ", 1)], flags=re.S)
    assert yaml.safe_load(block)["cloudstation:platform"]["monitoring"]["enabled"] is True
    assert objects(variant(OWN_CLUSTER), "PodMonitor")


def test_the_alerts_wait_for_nothing_they_watch(monitored):
    """PodMonitors, rules and scrape policies wait only for their namespace: a migration that fails
    or a store that never becomes ready (both awaited by the engine) must not keep its alert away."""
    from tests.test_standards import _waits_for

    waits_for = _waits_for(monitored)
    kinds = {r.urn: r.type.rsplit(":", 1)[-1] for r in monitored.registrations if r.custom}
    watched = ("Job", "StatefulSet", "Deployment", "StatefulService", "CronJob")
    checked = 0
    for registration in monitored.registrations:
        if not registration.custom or kinds[registration.urn] not in ("PodMonitor", "PrometheusRule", "NetworkPolicy"):
            continue
        if kinds[registration.urn] == "NetworkPolicy" and not registration.inputs["metadata"]["name"].endswith("-scrape"):
            continue
        checked += 1
        blocking = sorted(kinds[u] for u in waits_for[registration.urn] if kinds.get(u) in watched)
        assert blocking == [], (registration.name, blocking)
    assert checked


def test_every_rendered_alert_is_documented_and_the_docs_example_validates(monitored):
    text = (ROOT / "docs" / "monitoring.md").read_text()
    documented = set(re.findall(r"^\| `(\w+)` \|", text, flags=re.M))
    assert {rule["alert"] for _, rule in rules(monitored)} <= documented
    [block] = [b for b in re.findall(r"```yaml\n(.*?)```", text, flags=re.S) if "monitoring:" in b]
    example = yaml.safe_load(block)["cloudstation:platform"]["monitoring"]
    loaded = stacks.load(stacks.with_monitoring(example).values)
    assert loaded.platform.monitoring.model_dump(by_alias=True, mode="json") == {
        **MonitoringConfig().model_dump(by_alias=True, mode="json"), **example}
