"""Pulumi mocks that stand in for the engine and providers, for `render` and the tests.

The mock echoes every resource's inputs as its state and adds the outputs that providers would
compute and the program reads (image digests, generated passwords): an output the program reads
but the mock does not return silently disappears from dependent inputs (reference pulumi.md §4.1).
Values are deterministic, so two renders of the same config are byte-identical.

Dynamic resources (`pulumi-python:dynamic...`) have no provider here either: an EntityBuild
(components/entity_build.py) gets a made-up digest like every other mock image, and a KeptSecret
(components/kept_secret.py) made-up values as if its Secret did not exist, so render stays offline
and fast. With `ProgramMocks(dynamic=DynamicProviderHost(...))` (the tests' opt-in) they run
their real provider instead, as the engine and its dynamic-provider host would
(`DynamicProviderHost`): the whole program then builds against whatever Armada and registry the
stack config names (tests/test_builds_program.py: the fake Armada, the fake executor and a real
docker-registry).
"""
from __future__ import annotations

import base64
import hashlib
import json
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import pulumi
import yaml
from pulumi.runtime import rpc
from pulumi.runtime.mocks import MockMonitor, MockResourceArgs, _ensure_event_loop, _resolve_callbacks
from pulumi.runtime.proto import resource_pb2
from pulumi.runtime.sync_await import _sync_await

SECRET_SIG = {rpc._special_sig_key: rpc._special_secret_sig}


def as_secret(value: Any) -> dict:
    """The wire form of a secret value, so that `is_secret()` holds under mocks as in a real run."""
    return {**SECRET_SIG, "value": value}


def is_wrapped_secret(value: Any) -> bool:
    return isinstance(value, dict) and value.get(rpc._special_sig_key) == rpc._special_secret_sig


MOCK_DIGEST_PREFIX = "sha256:" + "0" * 16
"""Every digest the mocks make up starts so (a real sha256 digest does with odds of 2^-64): a reviewer
tells a mock digest from a real, pinned one, and it is still 64 hex digits, as schemas and checks want."""


def fake_digest(*parts: str) -> str:
    return MOCK_DIGEST_PREFIX + hashlib.sha256("\0".join(parts).encode()).hexdigest()[:48]


def _digest_of(reference: str) -> str:
    return reference.rsplit("@", 1)[-1]


def _docker_image(inputs: dict) -> dict:
    name = inputs.get("imageName", "")
    repository = name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name
    # Sorted: the engine passes map keys in no fixed order, and the digest must be deterministic.
    build = json.dumps(inputs.get("build"), sort_keys=True, default=str)
    return {"repoDigest": f"{repository}@{fake_digest(name, build)}"}


def _docker_build_image(inputs: dict) -> dict:
    tags = inputs.get("tags") or [""]
    digest = fake_digest(*tags, str(inputs.get("context")))
    return {"digest": digest, "ref": f"{tags[0]}@{digest}"}


ENTITY_BUILD_SUFFIX = ":EntityBuild"
"""Type suffix of the dynamic resource inside each EntityBuild (`pulumi-python:dynamic/<module>:EntityBuild`)."""


def is_entity_build(typ: str) -> bool:
    return typ.startswith("pulumi-python:dynamic") and typ.endswith(ENTITY_BUILD_SUFFIX)


def _entity_build(inputs: dict) -> dict:
    """A made-up result of a build: the digest the registry would answer for the pushed tag. Of the
    repository and tag only, as the real provider's (components/entity_build.py: a tag the
    registry has is never built again), so a change that keeps the tag keeps the digest here too;
    the builder changes it because it is hashed into the tag (infra/builds.py `builder`)."""
    repository, tag = inputs.get("repository", ""), inputs.get("contentTag", "")
    digest = fake_digest("entity-build", repository, tag)
    return {"digest": digest, "ref": f"{inputs.get('pullHost', '')}/{repository}:{tag}@{digest}", "jobId": ""}


KEPT_SECRET_TYPE = "pulumi-python:dynamic/secrets:KeptSecret"
"""The values of a kept Secret (components/kept_secret.py)."""


def is_kept_secret(typ: str) -> bool:
    return typ == KEPT_SECRET_TYPE


def _kept_secret(name: str) -> Callable[[dict], dict]:
    """Made-up values of a KeptSecret, as if its Secret did not exist yet (the provider would read
    it from the cluster): each key of `lengths` generated from the resource's name and the key, then
    the htpasswd line; secret, as the engine returns them (additionalSecretOutputs)."""
    from components.kept_secret import htpasswd

    def outputs(inputs: dict) -> dict:
        lengths = unwrap_secrets(inputs.get("lengths") or {})
        values = {key: hashlib.sha256(f"kept:{name}:{key}".encode()).hexdigest()[:int(length)]
                  for key, length in sorted(lengths.items())}
        spec = unwrap_secrets(inputs.get("htpasswd"))
        if spec:
            values[spec["key"]] = htpasswd(spec["username"], "$2y$10$" + hashlib.sha256(f"bcrypt:{name}".encode()).hexdigest()[:53])
        return {"values": as_secret(values)}

    return outputs


def kept_value(name: str, key: str, length: int) -> str:
    """The value the mocks make up for `key` of KeptSecret `name` (e.g. the registry's password)."""
    return _kept_secret(name)({"lengths": {key: length}})["values"]["value"][key]


def unwrap_secrets(value: Any) -> Any:
    """`value` as a provider that does not accept secrets receives it: every secret marker removed.
    The dynamic-provider host answers Configure with `acceptSecrets: False` (pulumi 3.272.0
    sdk/python/lib/pulumi/dynamic/__main__.py `Configure`), and the engine then marshals inputs with
    `KeepSecrets: false`, plain values (pulumi/pulumi pkg/resource/plugin/provider_plugin.go)."""
    if is_wrapped_secret(value):
        return unwrap_secrets(value["value"])
    if isinstance(value, dict):
        return {key: unwrap_secrets(item) for key, item in value.items()}
    if isinstance(value, list):
        return [unwrap_secrets(item) for item in value]
    return value


@dataclass
class DynamicCall:
    """One call the engine model made to a dynamic provider."""

    method: str
    """check, diff, create or update."""
    name: str
    """The resource's name."""


@dataclass
class DynamicProviderHost:
    """Runs dynamic resources' real providers under the mocks, as `pulumi up` (or preview) would.

    What the engine does with a dynamic resource (pulumi/pulumi pkg/resource/deploy/step_generator.go,
    and the host pulumi 3.272.0 sdk/python/lib/pulumi/dynamic/__main__.py that serves it):
    - the provider comes from the inputs: `get_provider` base64-decodes `__provider`, unpickles it
      with dill inside `_deserialize` (serialization context on) and calls `configure` once;
    - Check(olds, news) always, its failures stop the resource;
    - no prior state: Create (not in a preview, which only checks); with prior state (`state`, the
      checkpoint of an earlier run: name -> (id, outputs)): Diff(id, old outputs, news), then
      nothing, Update, or a replacing Create, by the answer; a preview stops after Diff;
    - Create's and Update's outputs get `__provider` back (`Create`, `Update`).
    (The host also resets the SDK's global Settings for its own process; here they are the mocks'.)
    `types` picks the resources it runs (default: EntityBuild; `is_kept_secret` for KeptSecrets, which
    read the kube context's cluster); others get the mocks' made-up outputs.
    `calls` records every provider call, for the tests."""

    types: Callable[[str], bool] = is_entity_build
    state: dict[str, tuple[str, dict]] = field(default_factory=dict)
    calls: list[DynamicCall] = field(default_factory=list)
    _providers: dict[str, Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def provider(self, serialized: str) -> Any:
        """`get_provider` of the dynamic-provider host: one unpickled, configured provider per text."""
        import dill
        from pulumi.dynamic import Config, ConfigureRequest
        from pulumi.runtime._serialization import _deserialize

        with self._lock:
            found = self._providers.get(serialized)
            if found is None:
                found = _deserialize(lambda: dill.loads(base64.b64decode(serialized)))
                found.configure(ConfigureRequest(config=Config(raw_config={}, project_name=pulumi.get_project())))
                self._providers[serialized] = found
        return found

    def _call(self, method: str, name: str) -> None:
        with self._lock:
            self.calls.append(DynamicCall(method, name))

    def run(self, name: str, inputs: dict, preview: bool) -> tuple[Optional[str], dict]:
        """(id, state) of the resource after the engine's steps; raises what the provider raises."""
        news = unwrap_secrets(inputs)
        provider = self.provider(news["__provider"])
        old = self.state.get(name)
        self._call("check", name)
        checked = provider.check(old[1] if old else {}, news)
        if checked.failures:
            raise ValueError(f"{name}: check failed: " + "; ".join(f"{f.property}: {f.reason}" for f in checked.failures))
        news = {**checked.inputs, "__provider": news["__provider"]}
        replace = True
        if old is not None:
            self._call("diff", name)
            diff = provider.diff(old[0], old[1], news)
            if diff.changes is False:
                return old  # a same step: the old outputs stay
            replace = bool(diff.replaces)
        if preview:
            return None, news  # outputs unknown until the step runs
        if replace:
            self._call("create", name)
            result = provider.create(news)
            id_, outs = result.id, dict(result.outs or {})
        else:
            self._call("update", name)
            id_, outs = old[0], dict(provider.update(old[0], old[1], news).outs or {})
        outs["__provider"] = news["__provider"]
        with self._lock:
            self.state[name] = (id_, outs)
        return id_, outs

    def calls_of(self, method: str) -> list[str]:
        return [call.name for call in self.calls if call.method == method]


def _random_password(name: str) -> Callable[[dict], dict]:
    def outputs(inputs: dict) -> dict:
        length = int(inputs.get("length", 24))
        result = hashlib.sha256(f"password:{name}".encode()).hexdigest()[:length]
        bcrypt_hash = "$2y$10$" + hashlib.sha256(f"bcrypt:{name}".encode()).hexdigest()[:53]
        return {"result": as_secret(result), "bcryptHash": as_secret(bcrypt_hash)}

    return outputs


def _random_id(name: str) -> Callable[[dict], dict]:
    def outputs(inputs: dict) -> dict:
        hex_ = hashlib.sha256(f"id:{name}".encode()).hexdigest()[: 2 * int(inputs.get("byteLength", 8))]
        return {"hex": hex_, "b64Std": hex_, "b64Url": hex_, "dec": str(int(hex_, 16))}

    return outputs


def _existing_secret(resource_id: str) -> dict:
    """An existing Secret `<namespace>/<name>` with `username` and `password` (base64), and the
    S3 keys `accessKeyId` and `secretAccessKey` of a backup target's Secret."""
    namespace, _, name = resource_id.partition("/")
    data = {
        key: base64.b64encode(f"{key}-of-{resource_id}".encode()).decode()
        for key in ("username", "password", "accessKeyId", "secretAccessKey")
    }
    return {"metadata": {"namespace": namespace, "name": name}, "type": "Opaque", "data": as_secret(data)}


@dataclass
class Registration:
    """One registered resource as the program asked for it."""

    urn: str
    type: str
    name: str
    custom: bool
    parent: str
    provider: str
    dependencies: list[str]
    inputs: dict
    options: dict = field(default_factory=dict)
    """The resource options the engine acts on (`request_options`): only those set, by wire name."""


@dataclass
class ProgramMocks(pulumi.runtime.Mocks):
    """Deterministic fakes for provider-computed outputs; records every registration."""

    registrations: list[Registration] = field(default_factory=list)
    made_up: dict[str, str] = field(default_factory=dict)
    """Every non-secret value the mocks made up (image digests) -> what made it up; render marks them."""
    reads: dict[str, str] = field(default_factory=dict)
    """URN -> `<type> <id>` of every existing object the program read (`Secret.get`, StackReference)."""
    dynamic: Optional[DynamicProviderHost] = None
    """Opt-in: run these dynamic resources' real providers (DynamicProviderHost); None: made-up outputs."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _made_up(self, digest: str, what: str) -> None:
        with self._lock:
            self.made_up[digest] = what

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[Optional[str], dict]:
        state = dict(args.inputs)
        if args.typ == "docker:index/image:Image":
            state.update(_docker_image(args.inputs))
            self._made_up(_digest_of(state["repoDigest"]), f"the docker mock's digest for {args.typ} {args.name}")
        elif args.typ == "docker-build:index:Image":
            state.update(_docker_build_image(args.inputs))
            self._made_up(state["digest"], f"the docker-build mock's digest for {args.typ} {args.name}")
        elif args.typ == "random:index/randomPassword:RandomPassword":
            state.update(_random_password(args.name)(args.inputs))
        elif args.typ == "random:index/randomId:RandomId":
            state.update(_random_id(args.name)(args.inputs))
        elif args.typ == "pulumi:pulumi:StackReference":
            state["outputs"] = {}
        elif self.dynamic is not None and self.dynamic.types(args.typ):
            return self.dynamic.run(args.name, args.inputs, pulumi.runtime.is_dry_run())
        elif is_kept_secret(args.typ):
            state.update(_kept_secret(args.name)(args.inputs))
        elif is_entity_build(args.typ):
            state.update(_entity_build(args.inputs))
            self._made_up(state["digest"], f"the mock's digest for the build {args.name} (no job runs under render)")
        elif args.typ == "kubernetes:core/v1:Secret" and args.resource_id:
            # `Secret.get` of an existing Secret (external stores copy credentials from one).
            state.update(_existing_secret(args.resource_id))
            return args.resource_id, state
        return f"{args.name}-id", state

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict:
        if args.token == "kubernetes:yaml:decode":
            return {"result": [d for d in yaml.safe_load_all(args.args["text"]) if d]}
        if args.token == "docker:index/getRegistryImage:getRegistryImage":
            digest = fake_digest(args.args["name"])
            self._made_up(digest, f"the docker mock's digest for getRegistryImage {args.args['name']}")
            return {"name": args.args["name"], "sha256Digest": digest}
        return {}


def request_options(request) -> dict:
    """The options of a RegisterResourceRequest that change what the engine does on update or
    delete, by their wire names; unset ones are left out. `deleteBeforeReplace` is kept when the
    program set it either way: an explicit False overrides the provider's own delete-before-replace
    (pulumi/pulumi pkg/resource/deploy/step_generator.go: `goal.DeleteBeforeReplace` wins over
    `diff.DeleteBeforeReplace`), and the Python SDK sends it only with `deleteBeforeReplaceDefined`
    (sdk/python/lib/pulumi/runtime/resource.py `register_resource`)."""
    options: dict = {}
    if request.protect:
        options["protect"] = True
    if request.retainOnDelete:
        options["retainOnDelete"] = True
    if request.deleteBeforeReplaceDefined:
        options["deleteBeforeReplace"] = bool(request.deleteBeforeReplace)
    if request.ignoreChanges:
        options["ignoreChanges"] = list(request.ignoreChanges)
    if request.replaceOnChanges:
        options["replaceOnChanges"] = list(request.replaceOnChanges)
    if request.HasField("customTimeouts"):
        timeouts = {
            key: getattr(request.customTimeouts, key)
            for key in ("create", "update", "delete")
            if getattr(request.customTimeouts, key)
        }
        if timeouts:
            options["customTimeouts"] = timeouts
    return options


class RecordingMonitor(MockMonitor):
    """A MockMonitor that also keeps what the engine would know: parent, provider, dependencies.

    Its RegisterResource does what MockMonitor's does (pulumi 3.272.0 sdk/python/lib/pulumi/runtime/mocks.py:
    deserialize the request's inputs, ask the mocks for id and state, answer with the state), at a
    third of the cost for the program's large inputs, with the same result for the program:
    - Outside preview the inputs are deserialized once, for the mocks and the record (MockMonitor's own
      pass drops unknowns, the record keeps them; outside preview there are none).
    - Outside preview the answer holds only the state the mocks changed or added, not the echoed
      inputs: the SDK takes every input the answer leaves out as its output, deserialized from the
      request it sent (runtime/rpc.py `resolve_outputs`: "input prop the engine didn't give us a final
      value for"), which is what an echo yields. In preview the SDK does not (unknown instead), so
      there the answer is the whole state, as before. tests/test_mocks_monitor.py renders the example
      stacks both ways and compares everything the program produced.
    """

    echo_inputs = False
    """True: answer with the whole state, as MockMonitor does (the comparison's reference)."""

    def __init__(self, mocks: ProgramMocks):
        super().__init__(mocks)
        self._lock = threading.Lock()

    def make_urn(self, parent: str, type_: str, name: str) -> str:
        """The engine's URN: the parent's whole qualified type chain, `$`-joined, before the type
        (pulumi/pulumi sdk/go/common/resource/urn/urn.go `New`, called by pkg/resource/deploy
        source_eval.go with `parent.QualifiedType()`), none for a child of the root stack. The SDK's
        MockMonitor keeps only the parent's own type, so a nested component's children got URNs no
        real deployment has (found by the end-to-end tier comparing a render with a real plan)."""
        if parent:
            parent_type = parent.split("::")[2]
            if parent_type != "pulumi:pulumi:Stack":
                type_ = f"{parent_type}${type_}"
        return "urn:pulumi:" + "::".join([pulumi.get_stack(), pulumi.get_project(), type_, name])

    def RegisterResource(self, request):
        if request.type == "pulumi:pulumi:Stack":
            return super().RegisterResource(request)
        preview = pulumi.runtime.is_dry_run()
        _ensure_event_loop()
        urn = self.make_urn(request.parent, request.type, request.name)
        recorded = rpc.deserialize_properties(request.object, keep_unknowns=True)
        inputs = rpc.deserialize_properties(request.object) if preview else recorded
        id_, state = self.mocks.new_resource(MockResourceArgs(
            typ=request.type, name=request.name, inputs=inputs, provider=request.provider,
            resource_id=request.importId, custom=request.custom or False,
            transforms=_resolve_callbacks(request.transforms),
        ))
        if not (preview or self.echo_inputs):
            state = {key: value for key, value in state.items() if key not in inputs or value is not inputs[key]}
        answer = _sync_await(rpc.serialize_properties(state, {}))
        registration = Registration(
            urn=urn,
            type=request.type,
            name=request.name,
            custom=bool(request.custom),
            parent=request.parent,
            provider=request.provider,
            dependencies=list(request.dependencies),
            inputs=recorded,
            options=request_options(request),
        )
        with self._lock:
            self.resources[urn] = MockMonitor.ResourceRegistration(urn, id_, {**inputs, **state})
            self.mocks.registrations.append(registration)
        return resource_pb2.RegisterResourceResponse(urn=urn, id=id_, object=answer)

    def ReadResource(self, request):
        # A resource with an `id` option (`Secret.get`, StackReference) is read, not registered
        # (pulumi 3.272.0 sdk/python/lib/pulumi/resource.py `Resource.__init__` -> runtime/resource.py
        # `read_resource` -> monitor.ReadResource): at `pulumi up` its state comes from the cluster
        # or the other stack; here the mock makes it up, and render marks what uses it.
        response = super().ReadResource(request)
        with self._lock:
            self.mocks.reads[response.urn] = f"{request.type} {request.id}"
        return response
