"""The Armada v0.22.7 REST API's schemas, from the vendored swagger (tests/upstream/armada-v0.22.7-api.swagger.json),
as JSON Schema validators for request bodies and for answers as the real server writes them.

Swagger 2.0 definitions are JSON Schema draft 4 with `$ref: #/definitions/<name>`, so they are used as they are,
with these translations (tests/upstream/PROVENANCE.md explains each against the upstream source):

- strict: every object that lists `properties` refuses other keys (`additionalProperties: false`). Armada's
  gateway (grpc-gateway v1.16.0 `runtime.JSONBuiltin`, i.e. Go's encoding/json) would silently drop them; a
  client that sends one has a bug the real server hides, so the fake refuses it.
- Kubernetes types as Kubernetes reads them: `intstrIntOrString` int or string, `v1Time` an RFC 3339 string,
  `resourceQuantity` a quantity string or a number (their UnmarshalJSON methods), not the swagger's structs.
- requests: enums may be names or numbers (pkg/api/deserialize.go UnmarshalJSON of JobState, IngressType...).
- answers ("wire"): enums are numbers (encoding/json of a Go int32 enum with no MarshalJSON), and the
  `date-time` strings of Armada's own messages are gogo `types.Timestamp` objects `{seconds, nanos}`.
"""
from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

import jsonschema

UPSTREAM = Path(__file__).resolve().parent / "upstream"
SWAGGER_FILES = {
    "server": UPSTREAM / "armada-v0.22.7-api.swagger.json",
    "binoculars": UPSTREAM / "armada-v0.22.7-binoculars.swagger.json",
}
"""pkg/api/api.swagger.json and pkg/api/binoculars/api.swagger.json at armadaproject/armada v0.22.7."""
SWAGGER_BLOBS = {"server": "f5c09de1ebe40089c6b46c430bfae56d9e6ff927", "binoculars": "d1543f3036385405135252bca26dd8633a8db4c3"}
"""Their git blob ids at the tag (tests/upstream/PROVENANCE.md)."""
SWAGGER_FILE, SWAGGER_BLOB = SWAGGER_FILES["server"], SWAGGER_BLOBS["server"]


@functools.lru_cache(None)
def swagger(api: str = "server") -> dict:
    return json.loads(SWAGGER_FILES[api].read_text(encoding="utf-8"))


def enum_values(definition: str) -> list[str]:
    """The names of a swagger enum in protobuf number order (the swagger lists them by number)."""
    return list(swagger()["definitions"][definition]["enum"])


JOB_STATES = enum_values("apiJobState")
"""QUEUED=0, PENDING=1, RUNNING=2, SUCCEEDED=3, FAILED=4, UNKNOWN=5, SUBMITTED=6, LEASED=7, PREEMPTED=8,
CANCELLED=9, REJECTED=10 (pkg/api/submit.pb.go JobState_name)."""
CAUSES = enum_values("apiCause")

QUANTITY = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
"""k8s.io/apimachinery resource.ParseQuantity's grammar (the swagger's resourceQuantity description)."""
TIMESTAMP = {"type": "object", "properties": {"seconds": {"type": "integer"}, "nanos": {"type": "integer"}},
             "additionalProperties": False}
"""gogo types.Timestamp through encoding/json (json tags seconds/nanos, numbers, zero omitted)."""

KUBERNETES_JSON = {
    "intstrIntOrString": {"type": ["integer", "string"]},
    "v1Time": {"type": ["string", "null"]},
    "resourceQuantity": {"anyOf": [{"type": "string", "pattern": QUANTITY}, {"type": "number"}]},
}


def _translate(node, wire: bool):
    if isinstance(node, list):
        return [_translate(item, wire) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _translate(value, wire) for key, value in node.items()
           if key != "properties" and not key.startswith("x-") and key not in ("title", "description", "default")}
    if isinstance(node.get("properties"), dict):  # field names are data: keep every one
        out["properties"] = {name: _translate(value, wire) for name, value in node["properties"].items()}
    if "enum" in node:
        numbers = {"type": "integer", "minimum": 0, "maximum": len(node["enum"]) - 1}
        names = {"type": "string", "enum": list(node["enum"])}
        return numbers if wire else {"anyOf": [names, numbers]}
    if wire and node.get("type") == "string" and node.get("format") == "date-time":
        return copy.deepcopy(TIMESTAMP)
    if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    out.pop("format", None)  # int32/int64/double/byte: the type says enough; draft 4 has no such formats
    return out


@functools.lru_cache(None)
def _definitions(wire: bool, api: str) -> dict:
    definitions = {name: _translate(schema, wire) for name, schema in swagger(api)["definitions"].items()}
    definitions.update(copy.deepcopy(KUBERNETES_JSON))
    return definitions


@functools.lru_cache(None)
def _validator(definition: str, wire: bool, api: str) -> jsonschema.Draft4Validator:
    definitions = _definitions(wire, api)
    if definition not in definitions:
        raise KeyError(f"no definition {definition!r} in {SWAGGER_FILES[api].name}")
    return jsonschema.Draft4Validator({"$ref": f"#/definitions/{definition}", "definitions": definitions})


def _errors(definition: str, body, wire: bool, api: str) -> list[str]:
    found = sorted(_validator(definition, wire, api).iter_errors(body), key=lambda e: list(map(str, e.absolute_path)))
    return [f"{definition} at {'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in found]


def request_errors(definition: str, body, api: str = "server") -> list[str]:
    """Why `body` is not a `definition` (e.g. apiJobSubmitRequest) the fake accepts; [] when it is."""
    return _errors(definition, body, False, api)


def response_errors(definition: str, body, api: str = "server") -> list[str]:
    """Why `body` is not a `definition` as Armada v0.22.7's gateway writes it; [] when it is."""
    return _errors(definition, body, True, api)


def operation(path: str, method: str = "post", api: str = "server") -> dict:
    """A path's operation in the swagger (to derive a request's or an answer's definition)."""
    return swagger(api)["paths"][path][method]


def body_definition(path: str, method: str = "post", api: str = "server") -> str:
    """The definition a path's request body must be (`#/definitions/<name>` of its `in: body` parameter)."""
    (body,) = [p for p in operation(path, method, api)["parameters"] if p["in"] == "body"]
    return body["schema"]["$ref"].rsplit("/", 1)[1]


def answer_definition(path: str, method: str = "post", api: str = "server") -> str:
    """The definition of a path's 200 answer (for a stream: the definition of each chunk's `result`)."""
    schema = operation(path, method, api)["responses"]["200"]["schema"]
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[1]
    return schema["properties"]["result"]["$ref"].rsplit("/", 1)[1]
