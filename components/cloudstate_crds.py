"""CloudState's custom resource definitions for the released (Scala) operator, as pure builders.

Upstream ships them as `apiextensions.k8s.io/v1beta1` without a schema (removed in Kubernetes
1.22). These are `v1` with structural schemas of exactly the fields the Scala operator 0.6.0 reads
(`operator/src/main/scala/io/cloudstate/operator/{StatefulStore,StatefulService}.scala` and
`stores/*.scala` at v0.6.0). Kubernetes types the operator only passes through (probes, env
sources, volumes...) keep their unknown fields; everything CloudState-specific is typed, so a typo
is rejected by the API server instead of silently ignored by the operator.
"""
from __future__ import annotations

GROUP = "cloudstate.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

STORE_TYPES = ["InMemory", "Cassandra", "Postgres"]

_STRING = {"type": "string"}
_OPEN_OBJECT = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
_QUANTITIES = {"type": "object", "additionalProperties": {"x-kubernetes-int-or-string": True}}
_RESOURCES = {"type": "object", "properties": {"limits": _QUANTITIES, "requests": _QUANTITIES}}
_STRINGS = {"type": "array", "items": _STRING}
# The operator writes conditions with its own fields (severity, lastTransitionTime...); keep them.
_STATUS = _OPEN_OBJECT


# Credential parameters the operator reads (v0.6.0 stores/CredentialsHelper.scala): Postgres all
# four (PostgresStoreSupport.scala), Cassandra `username` and `password` (CassandraStoreSupport.scala).
CREDENTIALS = ("database", "username", "password", "schema")


def _credentials_from_secret() -> dict:
    keys = {f"{name}Key": _STRING for name in CREDENTIALS}
    return {"type": "object", "required": ["name"], "properties": {"name": _STRING, **keys}}


def stateful_store_schema() -> dict:
    config = {
        "type": "object",
        "description": "Store-specific settings; Cassandra and Postgres need `service`.",
        "properties": {
            "service": {"type": "string", "minLength": 1, "description": "Host name of the database."},
            "port": {"type": "integer", "minimum": 1, "maximum": 65535, "description": "Postgres only."},
            # Each key becomes a secretKeyRef in the proxy's env. Optional parameters (Postgres
            # `schema`, both of Cassandra's) are read only when their `<name>Key` is given.
            "credentialsFromSecret": {
                **_credentials_from_secret(),
                "description": "Postgres: database, username, password, schema; Cassandra: username, password.",
            },
            "credentials": {
                "type": "object",
                "description": "Literal values (never used by this platform: credentials come from Secrets).",
                "properties": {k: _STRING for k in CREDENTIALS},
            },
        },
    }
    return {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                # Without a type the operator loops writing errors (cloudstate issue #324).
                "required": ["type"],
                "properties": {
                    "type": {"type": "string", "enum": STORE_TYPES},
                    "deployment": {"type": "string", "enum": ["Unmanaged"]},
                    "config": config,
                },
            },
            "status": _STATUS,
        },
    }


def _container() -> dict:
    port = {
        "type": "object",
        "required": ["containerPort"],
        "properties": {
            "containerPort": {"type": "integer", "minimum": 1, "maximum": 65535},
            "name": _STRING,
            "protocol": _STRING,
        },
    }
    mount = {
        "type": "object",
        "required": ["name", "mountPath"],
        "properties": {"name": _STRING, "mountPath": _STRING, "readOnly": {"type": "boolean"}, "subPath": _STRING},
    }
    env = {
        "type": "object",
        "required": ["name"],
        "properties": {"name": _STRING, "value": _STRING, "valueFrom": _OPEN_OBJECT},
    }
    return {
        "type": "object",
        "required": ["image"],
        "properties": {
            "name": _STRING,
            "image": {"type": "string", "minLength": 1},
            "imagePullPolicy": {"type": "string", "enum": ["Always", "IfNotPresent", "Never"]},
            "command": _STRINGS,
            "args": _STRINGS,
            "workingDir": _STRING,
            "ports": {"type": "array", "items": port},
            "env": {"type": "array", "items": env},
            "envFrom": {"type": "array", "items": _OPEN_OBJECT},
            "resources": _RESOURCES,
            "volumeMounts": {"type": "array", "items": mount},
            "volumeDevices": {"type": "array", "items": _OPEN_OBJECT},
            "livenessProbe": _OPEN_OBJECT,
            "readinessProbe": _OPEN_OBJECT,
            "lifecycle": _OPEN_OBJECT,
            "securityContext": _OPEN_OBJECT,
            "terminationMessagePath": _STRING,
            "terminationMessagePolicy": {"type": "string", "enum": ["File", "FallbackToLogsOnError"]},
            "stdin": {"type": "boolean"},
            "stdinOnce": {"type": "boolean"},
            "tty": {"type": "boolean"},
        },
    }


def stateful_service_schema() -> dict:
    autoscaling = {
        "type": "object",
        "properties": {
            "enabled": {"type": "boolean"},
            "userFunctionTargetConcurrency": {"type": "integer"},
            "requestTargetConcurrency": {"type": "integer"},
            "targetConcurrencyWindow": _STRING,
            "scaleUpStableDeadline": _STRING,
            "scaleDownStableDeadline": _STRING,
            "requestRateThresholdFactor": {"type": "number"},
            "requestRateWindow": _STRING,
        },
    }
    datastore = {
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": {"type": "string", "minLength": 1, "description": "A StatefulStore in the same namespace."},
            "config": {
                "type": "object",
                "properties": {
                    "keyspace": {"type": "string", "description": "Cassandra: required."},
                    "schema": {"type": "string", "description": "Postgres: optional (the 0.5.1 proxy ignores it)."},
                },
            },
        },
    }
    return {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "required": ["containers"],
                "properties": {
                    # The operator runs only the first container (as `user-container`).
                    "containers": {"type": "array", "minItems": 1, "maxItems": 1, "items": _container()},
                    "volumes": {"type": "array", "items": _OPEN_OBJECT},
                    "serviceAccountName": _STRING,
                    "autoscaling": autoscaling,
                    "datastore": datastore,
                    "sidecarResources": _RESOURCES,
                    "sidecarJvmMemory": _STRING,
                    "nodeSelector": {"type": "object", "additionalProperties": _STRING},
                    "tolerations": {"type": "array", "items": _OPEN_OBJECT},
                },
            },
            "status": _STATUS,
        },
    }


def _crd(kind: str, plural: str, schema: dict, columns: list[dict], short_names: list[str]) -> dict:
    name = f"{plural}.{GROUP}"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/part-of": "cloudstation", "app.kubernetes.io/managed-by": "pulumi"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            # No empty shortNames: the API server drops an empty list (omitempty), and the provider
            # would then see a change on every preview (found by the end-to-end tier).
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List",
                      **({"shortNames": short_names} if short_names else {})},
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        *columns,
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                }
            ],
        },
    }


def stateful_store_crd() -> dict:
    columns = [{"name": "Type", "type": "string", "description": "The type of stateful store", "jsonPath": ".spec.type"}]
    return _crd("StatefulStore", "statefulstores", stateful_store_schema(), columns, [])


def stateful_service_crd() -> dict:
    columns = [
        {"name": "Store", "type": "string", "jsonPath": ".spec.datastore.name"},
        {"name": "Image", "type": "string", "priority": 1, "jsonPath": ".spec.containers[0].image"},
    ]
    return _crd("StatefulService", "statefulservices", stateful_service_schema(), columns, ["ess"])


def crds() -> list[dict]:
    return [stateful_store_crd(), stateful_service_crd()]

