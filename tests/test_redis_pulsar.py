"""Armada's Redis and Pulsar: settings validation, pure spec builders, and the components under mocks."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from components import pulsar as pulsar_module
from components import redis as redis_module
from components.pulsar import Pulsar, PulsarArgs, PulsarSettings
from components.redis import Redis, RedisArgs, RedisSettings
from cloudstation_tools import validate
from cloudstation_tools.render import Rendered
from infra.versions import IMAGES
from tests.stacks import config_of
from tests.conftest import container, run_mocked, standard_violations


def build(mocked, make) -> tuple[list[dict], dict]:
    """Run `make()` (returns {name: Output}) under mocks; the Kubernetes objects and resolved outputs."""
    resolved = run_mocked(make)
    return Rendered("unit", mocked.registrations, {}).manifests(), resolved


def vars_of(component) -> dict:
    """The outputs a caller reads from a Redis or Pulsar component."""
    names = ("host", "port", "secret_name", "password_key") if isinstance(component, Redis) else ("url", "admin_url")
    return {name: getattr(component, name) for name in names}


def only(objects: list[dict], kind: str) -> dict:
    [match] = [o for o in objects if o["kind"] == kind]
    return match


# --- Redis -------------------------------------------------------------------------------------


def test_managed_redis_is_a_hardened_statefulset_with_its_password_only_in_a_secret(mocked):
    objects, outputs = build(mocked, lambda: vars_of(Redis("armada-redis", RedisArgs(RedisSettings(), "armada"))))

    assert validate.validate_all(objects) == []
    assert standard_violations(objects) == []
    assert sorted(o["kind"] for o in objects) == ["NetworkPolicy", "Secret", "Service", "StatefulSet"]
    secret = only(objects, "Secret")
    assert secret["stringData"] == {"password": "[secret]", "redis.conf": "[secret]"}
    [password] = [r for r in mocked.registrations if r.type.startswith("random:")]
    assert password.inputs["length"] >= 24 and password.inputs["special"] is False

    spec = only(objects, "StatefulSet")["spec"]
    pod = spec["template"]["spec"]
    redis = container(pod, "redis")
    assert redis["image"] == IMAGES["redis"]
    assert redis["args"] == ["redis-server", "/etc/redis/redis.conf"]
    assert redis["env"] == [
        {"name": "REDISCLI_AUTH", "valueFrom": {"secretKeyRef": {"name": "armada-redis", "key": "password"}}}
    ]
    assert redis["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsUser"] == 999 and pod["securityContext"]["fsGroup"] == 1000
    assert "redis-cli -p 6379 ping" in " ".join(redis["readinessProbe"]["exec"]["command"])
    assert redis["livenessProbe"]["exec"]
    assert {m["mountPath"] for m in redis["volumeMounts"]} == {"/data", "/etc/redis"}
    assert pod["volumes"][0]["secret"]["items"] == [{"key": "redis.conf", "path": "redis.conf"}]
    assert spec["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "2Gi"
    assert spec["serviceName"] == only(objects, "Service")["metadata"]["name"]

    assert outputs == {"host": "armada-redis.armada.svc.cluster.local", "port": 6379,
                       "secret_name": "armada-redis", "password_key": "password"}


def test_redis_config_file_carries_the_password_and_keeps_events():
    conf = redis_module.redis_conf(6380, "s3cret", append_only=True, memory_limit="512Mi")
    assert "requirepass s3cret\n" in conf
    assert "port 6380\n" in conf and "dir /data\n" in conf and "appendonly yes\n" in conf
    assert "maxmemory-policy noeviction\n" in conf
    assert "appendonly no\n" in redis_module.redis_conf(6379, "x", append_only=False, memory_limit="512Mi")


def test_redis_refuses_writes_before_the_container_is_oom_killed():
    # noeviction only takes effect under a maxmemory; it must leave room below the limit for the
    # forked AOF rewrite, or the kernel kills Redis first (and the AOF replay repeats it).
    for limit, limit_bytes in (("512Mi", 512 * 2**20), ("2Gi", 2 * 2**30), ("1G", 10**9)):
        conf = redis_module.redis_conf(6379, "x", append_only=True, memory_limit=limit)
        [line] = [line for line in conf.splitlines() if line.startswith("maxmemory ")]
        max_memory = int(line.split()[1])
        assert 0.5 * limit_bytes <= max_memory <= 0.8 * limit_bytes, (limit, max_memory)


def test_redis_spec_never_puts_the_password_in_args_or_literal_env():
    spec = redis_module.statefulset_spec("r", RedisSettings(port=6380), "img:1", "r-secret")
    redis = spec["template"]["spec"]["containers"][0]
    assert all("valueFrom" in env for env in redis["env"])
    assert not any("requirepass" in arg for arg in redis["args"])
    assert redis["ports"] == [{"name": "redis", "containerPort": 6380}]
    assert "storageClassName" not in spec["volumeClaimTemplates"][0]["spec"]
    fast = RedisSettings(storage={"size": "5Gi", "storageClass": "fast"})
    claim = redis_module.statefulset_spec("r", fast, "img:1", "s")["volumeClaimTemplates"][0]["spec"]
    assert claim["storageClassName"] == "fast" and claim["resources"]["requests"]["storage"] == "5Gi"


def test_external_redis_registers_nothing_and_passes_the_existing_secret_through(mocked):
    settings = RedisSettings(mode="external", host="redis.data.svc", port=6380, existing_secret="redis-auth",
                             password_key="redis-password")
    objects, outputs = build(mocked, lambda: vars_of(Redis("armada-redis", RedisArgs(settings, "armada"))))
    assert objects == []
    assert outputs == {"host": "redis.data.svc", "port": 6380, "secret_name": "redis-auth",
                       "password_key": "redis-password"}


@pytest.mark.parametrize(
    "settings, location, message",
    [
        ({"mode": "external", "existingSecret": "s"}, ".host", "required when mode is 'external'"),
        ({"mode": "external", "host": "h"}, ".existingSecret", "required when mode is 'external'"),
        ({"host": "h"}, ".host", "only allowed when mode is 'external'"),
        ({"passwordKey": "pw"}, ".passwordKey", "only allowed when mode is 'external'"),
        ({"mode": "external", "host": "redis:6379", "existingSecret": "s"}, "host", "should match pattern"),
        ({"mode": "external", "host": "h", "existingSecret": "s", "storage": {"size": "5Gi"}}, ".storage",
         "only allowed when mode is 'managed'"),
        ({"mode": "sentinel"}, "mode", "'managed' or 'external'"),
        ({"port": 0}, "port", "greater than or equal to 1"),
    ],
)
def test_bad_redis_settings_name_the_key(settings, location, message):
    with pytest.raises(ValidationError) as error:
        RedisSettings.model_validate(settings)
    [problem] = error.value.errors()
    where = ".".join(str(p) for p in problem["loc"]) + (problem.get("ctx") or {}).get("subpath", "")
    assert location in where and message in problem["msg"]


# --- Pulsar ------------------------------------------------------------------------------------


def test_managed_pulsar_is_one_standalone_broker_with_auto_created_topics(mocked):
    objects, outputs = build(mocked, lambda: vars_of(Pulsar("armada-pulsar", PulsarArgs(PulsarSettings(), "armada"))))

    assert validate.validate_all(objects) == []
    assert standard_violations(objects) == []
    assert sorted(o["kind"] for o in objects) == ["NetworkPolicy", "Service", "StatefulSet"]
    service = only(objects, "Service")
    assert service["spec"]["publishNotReadyAddresses"] is True  # the broker calls itself while starting
    assert {p["port"] for p in service["spec"]["ports"]} == {6650, 8080}

    spec = only(objects, "StatefulSet")["spec"]
    assert spec["replicas"] == 1
    pod = spec["template"]["spec"]
    broker = container(pod, "pulsar")
    assert broker["image"] == IMAGES["pulsar"]
    script = broker["args"][0]
    assert script.startswith("bin/apply-config-from-env.py conf/standalone.conf && exec bin/pulsar standalone")
    assert "--advertised-address armada-pulsar.armada.svc.cluster.local" in script
    env = {e["name"]: e["value"] for e in broker["env"]}
    assert env["PULSAR_PREFIX_allowAutoTopicCreation"] == "true"
    assert env["PULSAR_PREFIX_allowAutoTopicCreationType"] == "non-partitioned"
    defaults = PulsarSettings()
    assert env["PULSAR_MEM"] == (
        f"-Xms{defaults.heap} -Xmx{defaults.heap} -XX:MaxDirectMemorySize={defaults.direct_memory}"
    )
    assert broker["readinessProbe"]["httpGet"] == {"path": "/admin/v2/brokers/health", "port": "http"}
    # Pulsar serves no /status.gif, and /status.html is 404 without a statusFilePath file: probes
    # there would restart the broker forever. /admin/v2/brokers/ready answers once it started.
    for probe in ("startupProbe", "livenessProbe"):
        assert broker[probe]["httpGet"] == {"path": "/admin/v2/brokers/ready", "port": "http"}
    assert broker["startupProbe"]["failureThreshold"] * broker["startupProbe"]["periodSeconds"] >= 300
    assert broker["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m["name"] for m in broker["volumeMounts"]}
    assert mounts == {"/pulsar/data": "data", "/pulsar/conf": "conf", "/pulsar/logs": "logs", "/tmp": "tmp"}
    assert {v["name"] for v in pod["volumes"] if "emptyDir" in v} == {"conf", "logs", "tmp"}
    # The init container fills the writable conf/ with the image's defaults.
    copy = container(pod, "copy-conf")
    assert copy["volumeMounts"] == [{"name": "conf", "mountPath": "/writable-conf"}]
    assert "/pulsar/conf/." in copy["command"][-1]
    assert pod["securityContext"]["runAsUser"] == 10000 and pod["securityContext"]["runAsGroup"] != 0

    assert outputs == {"url": "pulsar://armada-pulsar.armada.svc.cluster.local:6650",
                       "admin_url": "http://armada-pulsar.armada.svc.cluster.local:8080"}


def test_external_pulsar_registers_nothing(mocked):
    settings = PulsarSettings(mode="external", url="pulsar+ssl://pulsar.example:6651", admin_url="https://pulsar.example",
                              cidrs=["10.8.0.0/24"])
    objects, outputs = build(mocked, lambda: vars_of(Pulsar("armada-pulsar", PulsarArgs(settings, "armada"))))
    assert objects == []
    assert outputs == {"url": "pulsar+ssl://pulsar.example:6651", "admin_url": "https://pulsar.example"}


def test_pulsar_jvm_sizes_follow_settings_and_mirror():
    settings = PulsarSettings(heap="1g", direct_memory="768m", resources={"memoryLimit": "3Gi", "memoryRequest": "3Gi"})
    spec = pulsar_module.statefulset_spec("p", settings, "mirror/pulsar:4.1.0", "p.ns.svc.cluster.local")
    broker = spec["template"]["spec"]["containers"][0]
    assert {"name": "PULSAR_MEM", "value": "-Xms1g -Xmx1g -XX:MaxDirectMemorySize=768m"} in broker["env"]
    assert broker["resources"]["limits"]["memory"] == "3Gi"


@pytest.mark.parametrize(
    "settings, location, message",
    [
        ({"mode": "external", "adminUrl": "http://a:8080"}, ".url", "required when mode is 'external'"),
        ({"mode": "external", "url": "pulsar://a:6650"}, ".adminUrl", "required when mode is 'external'"),
        ({"url": "pulsar://a:6650"}, ".url", "only allowed when mode is 'external'"),
        ({"mode": "external", "url": "pulsar://a:6650", "adminUrl": "http://a", "heap": "1g"}, ".heap",
         "only allowed when mode is 'managed'"),
        ({"mode": "external", "url": "http://a:6650", "adminUrl": "http://a"}, "url", "should match pattern"),
        ({"heap": "2g"}, ".resources.memoryLimit", "must fit in the memory limit"),
        ({"heap": "512"}, "heap", "should match pattern"),
    ],
)
def test_bad_pulsar_settings_name_the_key(settings, location, message):
    with pytest.raises(ValidationError) as error:
        PulsarSettings.model_validate(settings)
    [problem] = error.value.errors()
    where = ".".join(str(p) for p in problem["loc"]) + (problem.get("ctx") or {}).get("subpath", "")
    assert location in where and message in problem["msg"]


def test_memory_quantities_convert_to_mebibytes():
    assert pulsar_module.mebibytes("2Gi") == 2048
    assert pulsar_module.mebibytes("512m") == 512
    assert pulsar_module.mebibytes("1g") == 1024
    assert round(pulsar_module.mebibytes("1G")) == 954
    with pytest.raises(ValueError):
        pulsar_module.mebibytes("lots")


# --- the rendered graph of every stack that runs an Armada ----------------------------------------


def stack_objects(rendered, component: str) -> list[dict]:
    return [o for o in rendered.manifests()
            if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component]


def test_stacks_render_redis_as_configured_and_wire_it_into_armada(armada_rendered):
    rendered = armada_rendered  # each stack that runs an Armada (one per cluster)
    armada = config_of(rendered).platform.armada
    objects = stack_objects(rendered, "redis")
    if armada.redis.mode == "external":
        assert objects == []
        return
    assert sorted(o["kind"] for o in objects) == ["NetworkPolicy", "Secret", "Service", "StatefulSet"]
    assert {o["metadata"]["namespace"] for o in objects} == {armada.namespace}
    assert standard_violations(objects) == []
    assert validate.validate_all(objects) == []
    statefulset = next(o for o in objects if o["kind"] == "StatefulSet")
    claim = statefulset["spec"]["volumeClaimTemplates"][0]["spec"]
    assert claim["resources"]["requests"]["storage"] == armada.redis.storage.size
    redis = statefulset["spec"]["template"]["spec"]["containers"][0]
    assert redis["resources"] == armada.redis.resources.spec()
    assert not any("requirepass" in arg for arg in redis["args"])
    assert "exec" in redis["readinessProbe"] and "exec" in redis["livenessProbe"]
    # The one Redis is the event store of both the server and the event ingester (G7).
    address = f"armada-redis.{armada.namespace}.svc.cluster.local:{armada.redis.port}"
    configs = [data for o in rendered.manifests() if o["kind"] == "ConfigMap" for data in (o.get("data") or {}).values()]
    assert sum(address in data for data in configs) >= 2


def test_stacks_render_pulsar_as_configured_and_wire_it_into_armada(armada_rendered):
    rendered = armada_rendered  # each stack that runs an Armada (one per cluster)
    armada = config_of(rendered).platform.armada
    objects = stack_objects(rendered, "pulsar")
    configs = [data for o in rendered.manifests() if o["kind"] == "ConfigMap" for data in (o.get("data") or {}).values()]
    if armada.pulsar.mode == "external":
        assert objects == []
        url = armada.pulsar.url
    else:
        assert sorted(o["kind"] for o in objects) == ["NetworkPolicy", "Service", "StatefulSet"]
        assert standard_violations(objects) == []
        assert validate.validate_all(objects) == []
        statefulset = next(o for o in objects if o["kind"] == "StatefulSet")
        broker = container(statefulset["spec"]["template"]["spec"], "pulsar")
        assert {"name": "PULSAR_PREFIX_allowAutoTopicCreation", "value": "true"} in broker["env"]
        assert broker["resources"] == armada.pulsar.resources.spec()
        assert {"startupProbe", "readinessProbe", "livenessProbe"} <= set(broker)
        url = f"pulsar://armada-pulsar.{armada.namespace}.svc.cluster.local:6650"
    assert any(url in data for data in configs), f"no Armada config uses {url}"
