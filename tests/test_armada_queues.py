"""Armada queues as code: the REST client and the dynamic provider against a local fake of the
server's queue API (tests/fake_armada.py), the config rules, and the resources under mocks."""
from __future__ import annotations

import json

import pulumi
import pytest
from pulumi.dynamic.dynamic import serialize_provider
from pydantic import ValidationError

from components.armada import queue as queue_module
from components.armada.queue import (
    QueueApiSettings, QueueArgs, QueueProvider, Queues, QueuesArgs, changed_fields, project_queues, queue_props,
)
from components.armada.queue_api import QueueApiError, QueueClient, QueueExists
from infra import config as stack_config
from cloudstation_tools.mocks import is_wrapped_secret
from tests.stacks import config_of
from tests.conftest import create_in_provider_process
from tests.fake_armada import FakeArmada

ENTITY = {"name": "cart", "kind": "action", "language": "javascript", "source": "entities/shop/cart"}


@pytest.fixture
def armada():
    with FakeArmada() as server:
        yield server


def props(server: FakeArmada, **overrides) -> dict:
    """A Queue resource's inputs pointing at the fake server."""
    args = QueueArgs.model_validate({"name": "research", **overrides})
    return queue_props(args, QueueApiSettings(url=server.url, wait_seconds=0, timeout_seconds=5))


# --- the REST client --------------------------------------------------------------------------


def test_client_creates_reads_updates_and_deletes_a_queue(armada):
    client = QueueClient(armada.url)
    client.create({"name": "research", "priorityFactor": 2.0, "userOwners": ["alice"]})
    assert client.get("research") == {"name": "research", "priorityFactor": 2.0, "userOwners": ["alice"]}
    client.update({"name": "research", "priorityFactor": 3.0, "groupOwners": ["science"]})
    assert client.get("research") == {"name": "research", "priorityFactor": 3.0, "groupOwners": ["science"]}
    client.delete("research")
    assert client.get("research") is None
    client.delete("research")  # already gone: fine
    assert [(m, p) for m, p, _ in armada.requests] == [
        ("POST", "/v1/queue"), ("GET", "/v1/queue/research"), ("PUT", "/v1/queue/research"),
        ("GET", "/v1/queue/research"), ("DELETE", "/v1/queue/research"), ("GET", "/v1/queue/research"),
        ("DELETE", "/v1/queue/research"),
    ]


def test_client_reports_409_as_queue_exists(armada):
    client = QueueClient(armada.url)
    client.create({"name": "research", "priorityFactor": 1.0})
    with pytest.raises(QueueExists) as error:
        client.create({"name": "research", "priorityFactor": 1.0})
    assert error.value.status == 409 and "already exists" in str(error.value)


@pytest.mark.parametrize(
    "body, status, fragments",
    [
        ({"name": "q", "priorityFactor": 0.5}, 400, ["HTTP 400", "InvalidArgument", "priority factor cannot be lower than 1.0"]),
        ({"name": "secret-q", "priorityFactor": 1.0}, 403, ["HTTP 403", "PermissionDenied", "lacks permission create_queue"]),
    ],
)
def test_client_errors_carry_the_servers_message(armada, body, status, fragments):
    armada.deny.add("secret-q")
    with pytest.raises(QueueApiError) as error:
        QueueClient(armada.url).create(body)
    assert error.value.status == status
    for fragment in fragments:
        assert fragment in str(error.value)
    assert f"POST {armada.url}/v1/queue" in str(error.value)


def test_client_waits_for_a_starting_server(armada):
    armada.unavailable = 2
    QueueClient(armada.url, wait_seconds=5, retry_interval=0.01).create({"name": "q", "priorityFactor": 1.0})
    assert "q" in armada.queues
    assert len(armada.requests) == 3


def test_client_gives_up_on_an_unreachable_server_and_says_where_it_looked():
    with FakeArmada() as server:
        url = server.url
    with pytest.raises(QueueApiError) as error:
        QueueClient(url, timeout=2, wait_seconds=0).get("q")
    assert error.value.status is None
    assert f"is the server reachable at {url}?" in str(error.value) and "armada.queueApi.url" in str(error.value)


def test_error_bodies_of_both_gateway_versions_are_understood():
    from components.armada.queue_api import error_message

    assert error_message(b'{"code": 3, "message": "bad", "details": []}') == ("bad", 3)
    assert error_message(b'{"error": "old style", "code": 6}') == ("old style", 6)
    assert error_message(b"upstream connect error") == ("upstream connect error", None)
    assert error_message(b"") == ("(empty response)", None)


# --- the dynamic provider ---------------------------------------------------------------------


def test_provider_lifecycle_against_the_fake_server(armada):
    provider = QueueProvider()
    created = provider.create(props(armada, priorityFactor=2, userOwners=["alice"], labels={"team": "ml"}))
    assert created.id == "research"
    assert armada.queues["research"] == {
        "name": "research", "priorityFactor": 2.0, "userOwners": ["alice"], "labels": {"team": "ml"},
    }

    news = props(armada, priorityFactor=4, userOwners=["alice"], groupOwners=["ml"], cordoned=True)
    provider.update("research", created.outs, news)
    assert armada.queues["research"]["priorityFactor"] == 4.0
    assert armada.queues["research"]["groupOwners"] == ["ml"] and armada.queues["research"]["cordoned"] is True

    read = provider.read("research", news)
    assert read.id == "research"
    assert {k: read.outs[k] for k in ("priorityFactor", "groupOwners", "cordoned", "apiUrl")} == {
        "priorityFactor": 4.0, "groupOwners": ["ml"], "cordoned": True, "apiUrl": armada.url,
    }

    provider.delete("research", news)
    assert armada.queues == {}
    assert provider.read("research", news).id == ""  # gone: refresh drops it from state


def test_provider_adopts_an_existing_queue_and_makes_it_match(armada):
    QueueClient(armada.url).create({"name": "research", "priorityFactor": 9.0, "userOwners": ["mallory"]})
    result = QueueProvider().create(props(armada, userOwners=["alice"]))
    assert result.id == "research"
    assert armada.queues["research"] == {"name": "research", "priorityFactor": 1.0, "userOwners": ["alice"]}
    assert [m for m, _, _ in armada.requests] == ["POST", "POST", "PUT"]


def test_refresh_sees_changes_made_outside_pulumi(armada):
    provider = QueueProvider()
    state = provider.create(props(armada)).outs
    QueueClient(armada.url).update({"name": "research", "priorityFactor": 5.0, "userOwners": ["bob", "alice"]})
    live = provider.read("research", state).outs
    assert live["priorityFactor"] == 5.0 and live["userOwners"] == ["alice", "bob"]
    assert changed_fields(live, state) == ["priorityFactor", "userOwners"]


def test_provider_create_fails_with_the_servers_reason(armada):
    bad = {**props(armada), "priorityFactor": 0.5}  # past config validation, e.g. state edited by hand
    with pytest.raises(QueueApiError, match=r"HTTP 400, InvalidArgument\): .*priority factor cannot be lower than 1.0"):
        QueueProvider().create(bad)
    assert armada.queues == {}


def test_check_rejects_a_priority_factor_below_one():
    failures = QueueProvider().check({}, {"name": "q", "priorityFactor": 0.9}).failures
    assert [(f.property, f.reason) for f in failures] == [("priorityFactor", "must be at least 1, got 0.9")]
    assert QueueProvider().check({}, {"name": "q", "priorityFactor": 1}).failures == []


def test_diff_names_changed_fields_and_replaces_only_on_rename():
    old = {"name": "q", "priorityFactor": 1.0, "userOwners": ["a", "b"], "groupOwners": [], "labels": {},
           "cordoned": False, "apiUrl": "http://localhost:8080", "waitSeconds": 300, "timeoutSeconds": 30}
    provider = QueueProvider()

    same = provider.diff("q", old, {**old, "userOwners": ["b", "a"]})  # owner order is not a change
    assert same.changes is False and same.replaces == []

    tuned = {**old, "priorityFactor": 2.0, "cordoned": True}
    assert changed_fields(old, tuned) == ["priorityFactor", "cordoned"]
    diff = provider.diff("q", old, tuned)
    assert diff.changes is True and diff.replaces == []

    renamed = provider.diff("q", old, {**old, "name": "q2"})
    assert renamed.changes is True and renamed.replaces == ["name"]

    moved = provider.diff("q", old, {**old, "apiUrl": "http://armada.example"})
    assert moved.changes is True and moved.replaces == []


def test_provider_survives_pulumi_serialization(armada):
    """Pulumi pickles the provider into state and runs it in its dynamic-provider process, which
    starts in the program's directory (infra/) where `components` is not importable."""
    serialized = serialize_provider(QueueProvider())
    assert serialized == serialize_provider(QueueProvider())  # deterministic: no spurious diffs
    assert create_in_provider_process(serialized, props(armada))["id"] == "research" and "research" in armada.queues


def test_provider_authenticates_with_basic_auth_when_configured(armada):
    armada.authorization = queue_module.basic_auth("ci", "s3cret")
    with pytest.raises(QueueApiError, match=r"HTTP 401, Unauthenticated\): Request could not be authenticated"):
        QueueProvider().create(props(armada))
    QueueProvider().create({**props(armada), "authorization": queue_module.basic_auth("ci", "s3cret")})
    assert "research" in armada.queues


# --- config -----------------------------------------------------------------------------------


def stack(**armada) -> dict:
    return {
        "cloudstation:environment": "test",
        "cloudstation:projects": json.dumps([{"name": "shop", "entities": [ENTITY]}, {"name": "ml", "entities": [ENTITY]}]),
        # Builds in the cluster (the default mode) must say where they may pull from.
        "cloudstation:platform": json.dumps({"armada": armada, "builds": {"publicEgress": {"enabled": True}}}),
    }


def problems(**armada) -> list[str]:
    with pytest.raises(stack_config.ConfigError) as error:
        stack_config.load(stack(**armada))
    return error.value.problems


def test_every_project_gets_a_build_queue_after_the_configured_ones():
    config = stack_config.load(stack(queues=[{"name": "research", "priorityFactor": 2, "groupOwners": ["science"]}]))
    queues = project_queues(config)
    assert [(q.name, q.priority_factor) for q in queues] == [("research", 2.0), ("shop-builds", 1.0), ("ml-builds", 1.0)]
    assert queues[1].labels == {"cloudstation.io/project": "shop"}

    owned = stack_config.load(stack(projectQueue={"priorityFactor": 3, "groupOwners": ["builders"]}))
    assert {(q.priority_factor, tuple(q.group_owners)) for q in project_queues(owned)} == {(3.0, ("builders",))}
    assert project_queues(stack_config.load(stack(projectQueue={"enabled": False}))) == []


@pytest.mark.parametrize(
    "armada, expected",
    [
        ({"queues": [{"name": "q", "priorityFactor": 0.5}]},
         "cloudstation:platform.armada.queues[0].priorityFactor: 0.5 — must be at least 1"),
        ({"queues": [{"name": "q"}, {"name": "q"}]},
         "cloudstation:platform.armada.queues[1].name: 'q' — queue names must be unique"),
        ({"queues": [{"name": "Research_Q"}]}, "cloudstation:platform.armada.queues[0].name: 'Research_Q' — must be a DNS label"),
        ({"queues": [{"name": "shop-builds"}]},
         "cloudstation:platform.armada.queues[0].name: 'shop-builds' — already the build queue of a project"),
        ({"queueApi": {"url": "localhost:8080"}}, "cloudstation:platform.armada.queueApi.url: 'localhost:8080'"),
        ({"queues": [{"name": "q", "owners": ["a"]}]}, "cloudstation:platform.armada.queues[0].owners: unknown key"),
    ],
)
def test_bad_queue_config_is_rejected_with_the_key_and_value(armada, expected):
    [problem] = problems(**armada)
    assert problem.startswith(expected), problem


def test_queue_api_user_needs_its_password_in_a_secret_key():
    [problem] = problems(queueApi={"username": "ci"})
    assert problem.startswith("cloudstation:platform.armada.queueApi.username: 'ci' — needs the password in the "
                              "secret config key armadaQueueApiPassword"), problem
    values = {**stack(queueApi={"username": "ci"}), "cloudstation:armadaQueueApiPassword": "s3cret"}
    assert stack_config.load(values).platform.armada.queue_api.username == "ci"


def test_a_project_queue_name_is_free_again_when_project_queues_are_off():
    config = stack_config.load(stack(queues=[{"name": "shop-builds"}], projectQueue={"enabled": False}))
    assert [q.name for q in project_queues(config)] == ["shop-builds"]


def test_no_queue_resources_when_the_api_is_not_managed_from_this_stack():
    assert queue_module.queues_args(stack_config.load(stack(queueApi={"enabled": False}))) is None
    args = queue_module.queues_args(stack_config.load(stack(queueApi={"url": "https://armada.example/api"})))
    assert args.api.url == "https://armada.example/api" and len(args.queues) == 2


# --- the resources under mocks ----------------------------------------------------------------


def test_queues_register_one_dynamic_resource_each_after_the_server(mocked):
    names: list = []

    @pulumi.runtime.test
    def run():
        server = pulumi.CustomResource("test:index:Server", "armada-server", {})
        queues = Queues(
            "armada-queues",
            QueuesArgs([QueueArgs(name="research", priority_factor=2, user_owners=["alice"]), QueueArgs(name="shop-builds")],
                       QueueApiSettings(url="http://127.0.0.1:18080")),
            pulumi.ResourceOptions(depends_on=[server]),
        )
        return queues.names.apply(names.extend)

    run()
    assert names == ["research", "shop-builds"]
    component = next(r for r in mocked.registrations if r.type == "cloudstation:armada:Queues")
    server = next(r for r in mocked.registrations if r.type == "test:index:Server")
    resources = sorted((r for r in mocked.registrations if r.type == "pulumi-python:dynamic/armada:Queue"),
                       key=lambda r: r.name)
    assert [r.name for r in resources] == ["armada-queues-research", "armada-queues-shop-builds"]
    for resource in resources:
        assert resource.parent == component.urn
        assert server.urn in resource.dependencies  # created only once the server is up
        assert resource.inputs["__provider"]  # the serialized provider travels with the resource
    inputs = {k: v for k, v in resources[0].inputs.items() if k != "__provider"}
    assert inputs == {
        "name": "research", "priorityFactor": 2, "userOwners": ["alice"], "groupOwners": [], "labels": {},
        "cordoned": False, "apiUrl": "http://127.0.0.1:18080", "waitSeconds": 300, "timeoutSeconds": 30,
    }


def test_the_basic_auth_header_stays_secret_in_state(mocked):
    @pulumi.runtime.test
    def run():
        api = QueueApiSettings(url="https://armada.example", username="ci")
        Queues("armada-queues", QueuesArgs([QueueArgs(name="q")], api, password=pulumi.Output.secret("s3cret")))

    run()
    [queue] = [r for r in mocked.registrations if r.type == "pulumi-python:dynamic/armada:Queue"]
    assert is_wrapped_secret(queue.inputs["authorization"])
    assert queue.inputs["authorization"]["value"] == queue_module.basic_auth("ci", "s3cret")


def test_queue_args_validate_priority_factor_directly():
    with pytest.raises(ValidationError, match="must be at least 1"):
        QueueArgs(name="q", priority_factor=0)


# --- the rendered graph of every stack that runs an Armada ----------------------------------------


def test_stacks_manage_every_queue_through_the_configured_api_after_the_server(armada_rendered):
    rendered = armada_rendered  # each stack that runs an Armada (one per cluster)
    config = config_of(rendered)
    resources = sorted(rendered.of_type("pulumi-python:dynamic/armada:Queue"), key=lambda r: r.inputs["name"])
    expected = sorted(project_queues(config), key=lambda q: q.name)
    # In-cluster builds add the project-state entity's build queue (infra/builds.py build_queues).
    from infra import builds
    extra = ["platform-builds"] if builds.in_armada(config) else []
    assert [r.inputs["name"] for r in resources] == sorted([q.name for q in expected] + extra)
    assert {f"{config.projects[0].name}-builds", "research"} <= {q.name for q in expected}
    server = next(r for r in rendered.registrations
                  if r.type == "kubernetes:apps/v1:Deployment" and r.name == "armada-server-deploy")
    for resource, queue in zip([r for r in resources if r.inputs["name"] not in extra], expected):
        assert resource.name == f"armada-queues-{queue.name}"
        assert resource.inputs["apiUrl"] == config.platform.armada.queue_api.url
        assert resource.inputs["priorityFactor"] == queue.priority_factor >= 1
        assert resource.inputs["groupOwners"] == queue.group_owners
        assert server.urn in resource.dependencies
    assert sorted(rendered.outputs["armadaQueues"]) == sorted([q.name for q in expected] + extra)
