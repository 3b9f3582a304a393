"""The CloudState operator and its CRDs, on the rendered graph of both stack files and variants."""
from __future__ import annotations

import json

import pytest
import yaml

from components import cloudstate_crds as crds
from components import cloudstate_operator as operator
from infra import versions
from cloudstation_tools import checks, validate
from infra.cloudstation import project_namespace, project_state_namespace
from infra.config import ConfigError, StackConfig, load
from tests.stacks import validate_config  # prod as its first promotion writes it
from tests.stacks import SHARED_OWNER_WATCH, edited, rendered as variant
from tests.conftest import find, objects, pod_spec
from tests import stacks

CLUSTER_SCOPED = {
    "Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "PriorityClass", "StorageClass",
    "PersistentVolume", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "APIService", "IngressClass",
}


def own_namespaces(config: StackConfig) -> list[str]:
    """A stack's namespaces with StatefulServices: project-state's and every project's."""
    return [project_state_namespace(config.platform.namespace)] + [
        project_namespace(p.name, config.environment.value) for p in config.projects]


def structural_problems(schema: dict, path: str = "") -> list[str]:
    """What makes a schema non-structural: a node without a type that is not int-or-string."""
    problems = []
    if "type" not in schema and not schema.get("x-kubernetes-int-or-string"):
        problems.append(path or "(root)")
    for key, child in schema.get("properties", {}).items():
        problems += structural_problems(child, f"{path}.{key}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            problems += structural_problems(schema[key], f"{path}[{key}]")
    return problems


# --- which stack owns the cluster's CloudState ----------------------------------------------


@pytest.fixture
def owner(rendered_stacks):
    """The render of the repo's stack file that owns the cluster resources (the stack files
    describe one shared cluster: exactly one of them owns)."""
    owners = [s for s in rendered_stacks if validate_config(s).platform.owns_cluster_resources]
    assert len(owners) == 1, owners
    return rendered_stacks[owners[0]]


def test_exactly_one_stack_file_owns_the_shared_clusters_cloudstate(rendered_stacks, owner):
    for stack, rendered in rendered_stacks.items():
        cloudstate_crds = [o for o in objects(rendered, "CustomResourceDefinition") if o["spec"]["group"] == crds.GROUP]
        operators = [o for o in objects(rendered, "Deployment") if o["metadata"]["name"] == "cloudstate-operator"]
        expected = 2 if rendered is owner else 0
        assert (len(cloudstate_crds), 2 * len(operators)) == (expected, expected), stack
    platform_namespaces = {validate_config(s).platform.namespace for s in rendered_stacks}
    assert len(platform_namespaces) == len(rendered_stacks)  # no namespace is shared by two stacks


# --- CRDs ------------------------------------------------------------------------------------


def test_crds_are_v1_structural_with_status_and_printer_columns(owner):
    found = {o["metadata"]["name"]: o for o in objects(owner, "CustomResourceDefinition") if o["spec"]["group"] == crds.GROUP}
    assert set(found) == {"statefulstores.cloudstate.io", "statefulservices.cloudstate.io"}
    for crd in found.values():
        assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
        [version] = crd["spec"]["versions"]
        assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
        assert structural_problems(version["schema"]["openAPIV3Schema"]) == []
        assert version["subresources"] == {"status": {}}
        columns = version["additionalPrinterColumns"]
        assert columns and all(c["jsonPath"].startswith(".") and "JSONPath" not in c for c in columns)
    store_columns = {c["name"]: c["jsonPath"] for c in found["statefulstores.cloudstate.io"]["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert store_columns["Type"] == ".spec.type"


def test_crd_names_hold_no_empty_short_names(owner):
    """The API server drops an empty `shortNames` (omitempty), so the provider saw a change on every
    preview after the first `pulumi up` (found by the end-to-end tier, e2e/test_scenario.py step 2)."""
    for crd in objects(owner, "CustomResourceDefinition"):
        assert crd["spec"]["names"].get("shortNames", ["x"]), crd["metadata"]["name"]


def test_structural_check_catches_an_untyped_node():
    assert structural_problems({"type": "object", "properties": {"spec": {"properties": {}}}}) == [".spec"]


def test_store_schema_requires_a_type_and_rejects_unknown_ones():
    schemas = validate.crd_schemas(crds.crds())
    schema = schemas[(crds.API_VERSION, "StatefulStore")]

    def errors(spec):
        return validate.custom_errors({"apiVersion": crds.API_VERSION, "kind": "StatefulStore", "spec": spec}, schemas)

    assert errors({"type": "Postgres", "deployment": "Unmanaged", "config": {"service": "db", "port": 5432}}) == []
    assert errors({"deployment": "Unmanaged"})  # issue #324: no type
    assert errors({"type": "MySQL"})
    assert errors({"type": "Postgres", "config": {"servcie": "db"}})  # typo is rejected, not pruned
    assert schema["properties"]["spec"]["required"] == ["type"]


def test_store_schema_covers_the_config_the_scala_operator_reads():
    # v0.6.0 stores/{Postgres,Cassandra}StoreSupport.scala + CredentialsHelper.scala: Postgres reads
    # database/username/password/schema, Cassandra username/password, each literal or from a Secret.
    config = crds.stateful_store_schema()["properties"]["spec"]["properties"]["config"]["properties"]
    assert config.keys() == {"service", "port", "credentialsFromSecret", "credentials"}
    assert config["credentialsFromSecret"]["properties"].keys() == {
        "name", "databaseKey", "usernameKey", "passwordKey", "schemaKey"}
    assert config["credentials"]["properties"].keys() == {"database", "username", "password", "schema"}


def test_service_schema_covers_the_fields_the_scala_operator_reads():
    spec = crds.stateful_service_schema()["properties"]["spec"]["properties"]
    assert set(spec) == {
        "containers", "volumes", "serviceAccountName", "autoscaling", "datastore", "sidecarResources",
        "sidecarJvmMemory", "nodeSelector", "tolerations",
    }
    assert spec["datastore"]["properties"]["config"]["properties"].keys() == {"keyspace", "schema"}
    assert spec["autoscaling"]["properties"].keys() == {
        "enabled", "userFunctionTargetConcurrency", "requestTargetConcurrency", "targetConcurrencyWindow",
        "scaleUpStableDeadline", "scaleDownStableDeadline", "requestRateThresholdFactor", "requestRateWindow",
    }
    assert spec["containers"]["maxItems"] == 1  # the operator runs only the first container


def test_every_cloudstate_custom_resource_validates_against_the_clusters_crds(rendered, owner):
    schemas = validate.crd_schemas(objects(owner, "CustomResourceDefinition"))
    resources = [o for o in rendered.manifests() if o["apiVersion"] == crds.API_VERSION]
    assert {o["kind"] for o in resources} == {"StatefulStore", "StatefulService"}
    assert [p for o in resources for p in validate.custom_errors(o, schemas)] == []


def test_custom_resources_depend_on_the_crds_and_the_operator(owner):
    crd_urns = {r.urn for r in owner.of_type("kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition")
                if r.inputs["spec"]["group"] == crds.GROUP}
    [deployment] = [r for r in owner.of_type("kubernetes:apps/v1:Deployment") if r.name == "cloudstate-operator-deployment"]
    custom = [r for r in owner.registrations if r.type.startswith("kubernetes:cloudstate.io/")]
    assert len(crd_urns) == 2 and custom
    for registration in custom:
        assert crd_urns | {deployment.urn} <= set(registration.dependencies), registration.name


# --- operator --------------------------------------------------------------------------------


def test_operator_service_account_is_bound_in_the_namespace_it_runs_in(owner):
    namespace = validate_config(owner.stack).platform.namespace
    deployment = find(owner, "Deployment", "cloudstate-operator")
    assert deployment["metadata"]["namespace"] == namespace
    assert pod_spec(deployment)["serviceAccountName"] == "cloudstate-operator"
    find(owner, "ServiceAccount", "cloudstate-operator", namespace)
    reader = find(owner, "RoleBinding", "cloudstate-operator-config-reader-binding", namespace)
    assert reader["subjects"] == [{"kind": "ServiceAccount", "name": "cloudstate-operator", "namespace": namespace}]
    role = find(owner, "Role", reader["roleRef"]["name"], namespace)
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "watch"],
                              "resourceNames": ["cloudstate-operator-config"]}]


def operator_grants(rendered_stacks, subject: dict) -> list[tuple[str, str, str, str, str]]:
    """(binding kind, namespace or '*', apiGroup, resource, verb) of every permission that any
    binding of either stack file (one cluster) gives `subject`."""
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
             for r in rendered_stacks.values() for o in r.manifests() if o["kind"] in ("Role", "ClusterRole")}
    grants = []
    for rendered in rendered_stacks.values():
        for binding in rendered.manifests():
            if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding") or subject not in binding["subjects"]:
                continue
            namespace = binding["metadata"].get("namespace", "*")
            ref = binding["roleRef"]
            role = roles[(ref["kind"], None if ref["kind"] == "ClusterRole" else namespace, ref["name"])]
            grants += [(binding["kind"], namespace, g, r, v) for rule in role["rules"]
                       for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]]
    return grants


def test_the_operator_writes_only_in_the_namespaces_it_watches(owner, rendered_stacks):
    """Operator 0.6.0 with an explicit watch list makes only namespaced requests (v0.6.0
    OperatorMain.watchConfiguredNamespaces): no ClusterRoleBinding at all, and in each watched
    namespace, of whichever stack file, exactly what its source does there
    (components/cloudstate_operator.py NAMESPACE_RULES)."""
    namespace = validate_config(owner.stack).platform.namespace
    subject = {"kind": "ServiceAccount", "name": "cloudstate-operator", "namespace": namespace}
    config_map = find(owner, "ConfigMap", "cloudstate-operator-config", namespace)
    watched = operator.parse_operator_config(config_map["data"]["config"])["watch.namespaces"]
    grants = operator_grants(rendered_stacks, subject)
    assert not [g for g in grants if g[0] == "ClusterRoleBinding"]
    assert {g[1] for g in grants} == {namespace, *watched}
    assert {(g, r, v) for _, ns, g, r, v in grants if ns == namespace} == {("", "configmaps", "get"), ("", "configmaps", "watch")}
    needed = {("cloudstate.io", r, v) for r in ("statefulstores", "statefulservices") for v in ("get", "list", "watch")}
    needed |= {("cloudstate.io", r, "update") for r in ("statefulstores/status", "statefulservices/status")}
    needed |= {("apps", "deployments", v) for v in ("get", "list", "create", "update", "delete")}
    for ns in watched:
        assert {(g, r, v) for _, n, g, r, v in grants if n == ns} == needed, ns
    # Nothing that upstream's ClusterRole has and this operator cannot use on Kubernetes >= 1.22.
    assert not [g for g in grants if g[3] in ("roles", "rolebindings", "pods", "services", "namespaces", "deployments/scale")]


def test_each_stack_grants_the_operator_its_own_namespaces(rendered_stacks, owner):
    """The stack that owns a namespace binds the operator in it (so the binding lives and dies with
    the namespace); a stack that shares the cluster reads the operator's namespace from its owner's
    stack file (platform.clusterOwnerStack)."""
    operator_namespace = validate_config(owner.stack).platform.namespace
    for stack, rendered in rendered_stacks.items():
        for ns in own_namespaces(validate_config(stack)):
            binding = find(rendered, "RoleBinding", operator.NAMESPACE_ROLE, ns)
            assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "cloudstate-operator", "namespace": operator_namespace}]
            assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": operator.NAMESPACE_ROLE}
            assert find(rendered, "Role", operator.NAMESPACE_ROLE, ns)["rules"] == operator.NAMESPACE_RULES


def test_operator_watches_exactly_the_namespaces_that_run_entities_on_its_cluster(owner, rendered_stacks):
    config_map = find(owner, "ConfigMap", "cloudstate-operator-config", validate_config(owner.stack).platform.namespace)
    watched = operator.parse_operator_config(config_map["data"]["config"])["watch.namespaces"]
    # Both stack files share one cluster: the owner's operator runs both stacks' entities.
    assert watched == sorted(ns for stack in rendered_stacks for ns in own_namespaces(validate_config(stack)))
    entity_namespaces = {o["metadata"]["namespace"] for r in rendered_stacks.values() for o in r.manifests()
                         if o["apiVersion"] == crds.API_VERSION}
    assert set(watched) == entity_namespaces


def test_proxy_images_are_pinned_to_the_proxy_release(owner):
    config_map = find(owner, "ConfigMap", "cloudstate-operator-config")
    images = operator.parse_operator_config(config_map["data"]["config"])["proxy.image"]
    assert set(images) == {"cassandra", "postgres", "no-store", "in-memory"}
    for key, image in images.items():
        assert versions.tag_of(image) == versions.CLOUDSTATE_PROXY, image
        assert checks.image_violations("proxy", {"containers": [{"name": key, "image": image}]}) == []
    # one proxy per store type, the ones v0.5.1 published
    assert images["no-store"] == versions.image("cloudstate-proxy-no-store")
    assert images["in-memory"] == versions.image("cloudstate-proxy-in-memory")


def test_operator_image_is_the_operator_release(owner):
    [container] = pod_spec(find(owner, "Deployment", "cloudstate-operator"))["containers"]
    assert container["image"] == versions.image("cloudstate-operator")
    assert container["image"].split("@")[0].endswith(f"/cloudstate-operator:{versions.CLOUDSTATE_OPERATOR}")


def test_proxies_speak_the_protocol_of_the_node_sdk():
    # npm `cloudstate` 0.0.3 (tests/test_entities.py pins it) speaks v0.5; v0.6 proxies reject it.
    assert versions.CLOUDSTATE_PROXY.startswith("0.5.")
    assert all(versions.tag_of(versions.IMAGES[image]) == versions.CLOUDSTATE_PROXY for image in operator.PROXY_IMAGES.values())


def test_operator_deployment_is_hardened(owner):
    deployment = find(owner, "Deployment", "cloudstate-operator")
    spec = pod_spec(deployment)
    assert deployment["spec"]["strategy"] == {"type": "Recreate"} and deployment["spec"]["replicas"] == 1
    assert checks.restricted_violations("operator", spec) == []
    assert checks.resource_violations("operator", spec) == []
    # v0.6.0's image (sbt-native-packager 1.7.4): `USER 1001:0`, files owned by 1001:root, mode u=rX,g=rX.
    assert (spec["securityContext"]["runAsUser"], spec["securityContext"]["runAsGroup"]) == (1001, 0)
    [container] = spec["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    env = {e["name"]: e for e in container["env"]}
    assert env["JAVA_OPTS"]["value"].startswith("-Xms")
    assert env["NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["CONFIG_MAP"]["value"] == "cloudstate-operator-config"


def test_a_proxy_bump_reaches_the_running_operator_through_its_config_watch(owner):
    """v0.6.0 reloads its config when the ConfigMap `CONFIG_MAP` in `NAMESPACE` is modified
    (OperatorMain.scala Watcher.watchSingle, maybeRestart), so no restart of the Deployment is
    needed: the ConfigMap it names must be the rendered one, carry the proxy images under key
    `config`, and be readable and watchable by the operator's account."""
    deployment = find(owner, "Deployment", "cloudstate-operator")
    namespace = deployment["metadata"]["namespace"]
    [container] = pod_spec(deployment)["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    config_map = find(owner, "ConfigMap", env["CONFIG_MAP"]["value"], namespace)
    parsed = operator.parse_operator_config(config_map["data"]["config"])
    mirror = validate_config(owner.stack).platform.image_mirror
    assert parsed["proxy.image"] == operator.proxy_images(mirror)
    account = pod_spec(deployment)["serviceAccountName"]
    granted = set()
    for binding in objects(owner, "RoleBinding"):
        if binding["metadata"]["namespace"] == namespace and {"kind": "ServiceAccount", "name": account,
                                                               "namespace": namespace} in binding["subjects"]:
            role = find(owner, "Role", binding["roleRef"]["name"], namespace)
            granted |= {verb for rule in role["rules"] if "configmaps" in rule["resources"]
                        and config_map["metadata"]["name"] in rule.get("resourceNames", [config_map["metadata"]["name"]])
                        for verb in rule["verbs"]}
    assert {"get", "watch"} <= granted


def test_operator_config_is_explicit_hocon():
    text = operator.operator_config(["b", "a", "a"], {"postgres": "x/y:1"})
    assert text == 'cloudstate.operator {\n  watch.namespaces = ["a", "b"]\n  proxy.image {\n    postgres = "x/y:1"\n  }\n}\n'
    assert operator.parse_operator_config(text) == {"watch.namespaces": ["a", "b"], "proxy.image": {"postgres": "x/y:1"}}
    for bad in ([], ["*"], ["a", "*"]):
        with pytest.raises(ValueError):
            operator.operator_config(bad, {})


# --- one or two clusters ---------------------------------------------------------------------


@pytest.mark.parametrize("source", ["prod stack file", "test stack, non-owner variant"])
def test_a_stack_that_does_not_own_the_cluster_registers_no_cluster_scoped_object(source, rendered_stacks):
    rendered = rendered_stacks["prod"] if source == "prod stack file" else variant("non-owner")
    kinds = {o["kind"] for o in rendered.manifests()}
    # Namespaces are per stack; nothing else cluster-scoped (not even Armada's executor bindings:
    # the owner runs the cluster's one Armada).
    assert kinds & CLUSTER_SCOPED == {"Namespace"}
    bindings = objects(rendered, "ClusterRoleBinding")
    assert not [b for b in bindings if b["roleRef"]["name"] == "cloudstate-operator-role"]
    namespaces = {o["metadata"]["name"] for o in objects(rendered, "Namespace")}
    assert all(s["namespace"] in namespaces for b in bindings for s in b["subjects"])
    assert not [o for o in objects(rendered, "Deployment") if o["metadata"]["name"] == "cloudstate-operator"]
    assert not [o for o in objects(rendered, "ConfigMap") if o["metadata"]["name"] == "cloudstate-operator-config"]
    # Its custom resources are still there, for the owning stack's operator to run.
    assert {o["kind"] for o in rendered.manifests() if o["apiVersion"] == crds.API_VERSION} == {"StatefulStore", "StatefulService"}


def test_the_owner_also_watches_the_namespaces_of_the_stack_that_shares_its_cluster():
    rendered = variant("owner-external-cassandra")
    config_map = find(rendered, "ConfigMap", "cloudstate-operator-config")
    watched = operator.parse_operator_config(config_map["data"]["config"])["watch.namespaces"]
    assert watched == sorted(own_namespaces(validate_config("prod")) + SHARED_OWNER_WATCH)


def test_both_stacks_custom_resources_validate_against_the_owners_crds():
    owner_crds = objects(variant("owner-external-cassandra"), "CustomResourceDefinition")
    resources = [o for o in variant("non-owner").manifests() if o["apiVersion"] == crds.API_VERSION]
    assert validate.validate_all(resources, extra_crds=owner_crds) == []


def test_extra_watched_namespaces_need_the_operator():
    stack_file = edited("test", platform=lambda p: stacks.sharing(p, cloudstate={"extraWatchedNamespaces": ["shop-prod"]}))
    with pytest.raises(ConfigError) as caught:
        load(stack_file.values)
    [problem] = caught.value.problems
    assert problem.startswith("cloudstation:platform.cloudstate.extraWatchedNamespaces: [\"shop-prod\"] — ")
    assert "ownsClusterResources: true" in problem


# --- what is kept when a stack drops it (docs/cloudstate.md, "What is kept") -----------------


def registration(rendered, kind: str, name: str, namespace=None):
    [match] = [r for r in rendered.registrations if r.custom and isinstance(r.inputs, dict)
               and r.inputs.get("kind") == kind and r.inputs.get("metadata", {}).get("name") == name
               and r.inputs.get("metadata", {}).get("namespace") == namespace]
    return match


def retained(rendered, kind: str, name: str, namespace=None) -> bool:
    return registration(rendered, kind, name, namespace).options.get("retainOnDelete") is True


def test_the_crds_outlive_the_stack_that_owns_them(owner):
    """Deleting a CRD deletes every StatefulService and StatefulStore of the cluster, those of the
    stacks that share it included: `pulumi destroy` of the owner (or a rename) leaves them."""
    crds_ = [o for o in objects(owner, "CustomResourceDefinition") if o["spec"]["group"] == crds.GROUP]
    assert len(crds_) == 2
    for crd in crds_:
        assert retained(owner, "CustomResourceDefinition", crd["metadata"]["name"]), crd["metadata"]["name"]


def data_holders(rendered) -> list[tuple[str, dict]]:
    """(namespace, pod spec) of every CloudStation workload that keeps data on a volume: a
    StatefulSet with volume claims, or a pod mounting a PersistentVolumeClaim (Armada's own stores
    are its area's: docs/armada.md)."""
    armada = validate_config(rendered.stack).platform.armada.namespace
    found = []
    for obj in rendered.manifests():
        if obj["kind"] not in ("Deployment", "StatefulSet") or obj["metadata"]["namespace"] == armada:
            continue
        spec = pod_spec(obj)
        claims = obj["spec"].get("volumeClaimTemplates") or [v for v in spec.get("volumes", []) if "persistentVolumeClaim" in v]
        if claims:
            found.append((obj["metadata"]["namespace"], obj))
    return found


def rebuilt_from_kept(rendered, name: str, namespace: str) -> bool:
    """A Secret made anew at every deployment from every kept Secret of its namespace (through their
    KeptSecret `<secret>-values`) and from values no kept data needs: the registry's htpasswd file,
    whose kept users' lines are those of `registry-auth` and each `registry-pull-<project>`, and whose
    build users' lines are new after a destroy (components/registry.py). Retaining it would make such
    a redeployment conflict on it; the kept credentials it carries are retained where they come from."""
    secret = registration(rendered, "Secret", name, namespace)
    kept = {f"{r.inputs['metadata']['name']}-values" for r in rendered.registrations
            if r.custom and isinstance(r.inputs, dict) and r.inputs.get("kind") == "Secret"
            and r.inputs.get("metadata", {}).get("namespace") == namespace and r.options.get("retainOnDelete") is True}
    values = {r.name: r.urn for r in rendered.registrations if r.type == "pulumi-python:dynamic/secrets:KeptSecret"}
    return bool(kept) and all(n in values and values[n] in secret.dependencies for n in kept)


@pytest.mark.parametrize("source", ["test", "prod", "non-owner", "owner-external-cassandra"])
def test_data_its_namespace_and_its_credentials_outlive_the_project_and_the_stack(source, rendered_stacks):
    """Removing a project deletes its namespace, and a namespace takes every volume in it. So
    each namespace holding a store's (or the registry's) volume is kept, with the volume claims and
    the Secrets the server reads (the kept data must stay readable); StatefulSets keep their claims."""
    rendered = rendered_stacks[source] if source in rendered_stacks else variant(source)
    holders = data_holders(rendered)
    assert holders
    armada = validate_config(rendered.stack).platform.armada.namespace
    created = {o["metadata"]["name"] for o in objects(rendered, "Namespace")} - {armada}
    kept_namespaces = set()
    for namespace, workload in holders:
        what = f"{source}: {workload['kind']} {namespace}/{workload['metadata']['name']}"
        if namespace in created:
            assert retained(rendered, "Namespace", namespace), what
            kept_namespaces.add(namespace)
        spec = pod_spec(workload)
        if workload["kind"] == "StatefulSet":
            assert workload["spec"]["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}, what
        for volume in spec.get("volumes", []):
            if "persistentVolumeClaim" in volume:
                assert retained(rendered, "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"], namespace), what
            if "secret" in volume:
                name = volume["secret"]["secretName"]
                assert retained(rendered, "Secret", name, namespace) or rebuilt_from_kept(rendered, name, namespace), what
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert retained(rendered, "Secret", ref["name"], namespace), f"{what} {env['name']}"
    # Only those: a namespace whose store is external (or absent) goes with its project.
    for name in created - kept_namespaces:
        assert not retained(rendered, "Namespace", name), f"{source}: namespace {name} holds no data"


# --- a namespace no operator watches (infra/cluster_sharing.py) ------------------------------


def with_project(projects: list, name: str) -> list:
    """The projects plus a copy of the first one named `name` (its promoted images renamed)."""
    first = projects[0]
    entities = [{**e, **({"image": e["image"].replace(f"/{first['name']}/", f"/{name}/")} if "image" in e else {})}
                for e in first["entities"]]
    return [*projects, {**first, "name": name, "entities": entities}]


def test_a_project_added_only_to_the_sharing_stack_fails_before_any_resource(monkeypatch):
    from infra import context, program
    from cloudstation_tools.mocks import ProgramMocks, RecordingMonitor
    import pulumi
    import pulumi.runtime.settings

    stack_file = edited("prod", projects=lambda projects: with_project(projects, "blog"))
    index = len(json.loads(stack_file.values["cloudstation:projects"])) - 1  # the added project, last
    with pytest.raises(ConfigError) as caught:
        stacks.render("prod", stack_file=stack_file)
    [problem] = caught.value.problems
    assert problem == (
        f"cloudstation:projects[{index}].name: namespace 'blog-prod' — the CloudState operator of the owner stack 'test' "
        "(platform.clusterOwnerStack) does not watch it, so its entities would never run; add 'blog-prod' to "
        "platform.cloudstate.extraWatchedNamespaces in Pulumi.test.yaml and deploy test first")
    # The program itself (as `pulumi up` runs it) stops in its config check: nothing is registered.
    monkeypatch.setattr(context, "STACK_DIR", stacks.DIR)  # its owner's file: the fixture test stack
    mocks = ProgramMocks()
    pulumi.runtime.settings.ROOT.set(None)
    pulumi.runtime.set_mocks(mocks, project="cloudstation", stack="prod", preview=False, monitor=RecordingMonitor(mocks))
    pulumi.runtime.set_all_config(stack_file.values, stack_file.secret_keys)
    with pytest.raises(pulumi.RunError, match="'blog-prod'"):
        program.main()
    assert mocks.registrations == []


def test_the_owner_refuses_to_deploy_without_the_namespaces_of_a_stack_that_names_it(tmp_path):
    from infra import cluster_sharing

    for stack in ("test", "prod"):
        (tmp_path / f"Pulumi.{stack}.yaml").write_text((stacks.DIR / f"Pulumi.{stack}.yaml").read_text())
    owner_config = validate_config("test")
    assert cluster_sharing.problems(owner_config, "Pulumi.test.yaml", tmp_path) == []
    prod = yaml.safe_load((tmp_path / "Pulumi.prod.yaml").read_text())
    prod["config"]["cloudstation:projects"] = with_project(prod["config"]["cloudstation:projects"], "blog")
    (tmp_path / "Pulumi.prod.yaml").write_text(yaml.safe_dump(prod))
    [problem] = cluster_sharing.problems(owner_config, "Pulumi.test.yaml", tmp_path)
    watched = sorted(owner_config.platform.cloudstate.extra_watched_namespaces)
    assert problem.startswith(f"cloudstation:platform.cloudstate.extraWatchedNamespaces: {watched} — misses 'blog-prod' "
                              "of stack 'prod' (Pulumi.prod.yaml shares this cluster: platform.clusterOwnerStack: test)")
    # A stack with its own cluster is no concern of the owner's.
    prod["config"]["cloudstation:platform"]["ownsClusterResources"] = True
    (tmp_path / "Pulumi.prod.yaml").write_text(yaml.safe_dump(prod))
    assert cluster_sharing.problems(owner_config, "Pulumi.test.yaml", tmp_path) == []


@pytest.mark.parametrize("owner, expected", [
    ("staging", "cloudstation:platform.clusterOwnerStack: 'staging' — no stack file Pulumi.staging.yaml in "),
    ("prod", "cloudstation:platform.clusterOwnerStack: 'prod' — Pulumi.prod.yaml does not own its cluster "
             "(ownsClusterResources: false); name the stack that does"),
])
def test_the_owner_stack_must_exist_and_own_the_cluster(owner, expected):
    stack_file = edited("prod", platform=lambda p: {**p, "clusterOwnerStack": owner})
    with pytest.raises(ConfigError) as caught:
        stacks.load(stack_file.values, source="Pulumi.prod.yaml")
    [problem] = caught.value.problems
    assert problem.startswith(expected)


def test_only_a_stack_that_does_not_own_its_cluster_names_an_owner():
    stack_file = edited("test", platform=lambda p: {**p, "clusterOwnerStack": "prod"})
    with pytest.raises(ConfigError) as caught:
        load(stack_file.values)
    assert caught.value.problems == [
        "cloudstation:platform.clusterOwnerStack: 'prod' — only for a stack that does not own its cluster "
        "(ownsClusterResources: false)"]


def test_the_project_state_namespace_must_fit_a_namespace_name():
    long = "p" * 58
    stack_file = edited("test", platform=lambda p: {**p, "namespace": long})
    with pytest.raises(ConfigError) as caught:
        load(stack_file.values)
    assert caught.value.problems == [
        f"cloudstation:platform.namespace: '{long}' — project-state runs in '{long}-state', longer than a namespace "
        "name may be (63); shorten the platform namespace to at most 57 characters"]
    assert load(edited("test", platform=lambda p: {**p, "namespace": "p" * 57}).values)
