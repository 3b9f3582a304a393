"""Generated credentials of a kept Secret (retainOnDelete), taken back from the cluster when it has them.

A store's or the registry's credentials Secret outlives `pulumi destroy` with the data it opens
(docs/cloudstate.md "What is kept"): the postgres image applies POSTGRES_PASSWORD only to an empty data
directory, Cassandra keeps its roles in system_auth, the registry's images stay on its claim. A stack
deployed again over them must apply that Secret with the values it holds: with new ones the store's
clients are refused, and pulumi-kubernetes' server-side apply (a create is an apply, provider/pkg/await/
await.go `Creation`: "we currently always upsert the object") runs under a new field manager
(provider/pkg/provider/provider.go `fieldManagerName`, from the resource's random seed), which conflicts
with the previous deployment's manager on every field whose value differs (`.data.password`). With
the same values the new manager shares ownership and nothing conflicts.

`KeptSecret` (type `pulumi-python:dynamic/secrets:KeptSecret`) yields those values (output `values`,
secret). Its provider, when the resource is created:
- reads Secret `namespace`/`name` through the Kubernetes API with the stack's kube context (the
  kubeconfig loading of components/kube_tunnel.py: KUBECONFIG, the context, in a pod its service
  account), unless `cluster` is false (kubernetes.renderYamlToDirectory: no cluster);
- keeps each value of `lengths` the Secret holds, generates only the missing ones (`generate`: the
  alphabet and length of pulumi-random's RandomPassword(length, special=False));
- with `htpasswd`, keeps the Secret's htpasswd file when its one entry is the user's and verifies
  against the password (bcrypt.checkpw), else computes it (bcrypt is salted: a new hash of the same
  password would differ from the kept one, and conflict).
A Secret absent (or its namespace) means a first deployment: everything is generated. Any other
failure to read it fails the create: generating instead would replace a password kept data needs.

Only Secrets kept with data need this; passwords no data holds (Armada's users, Redis's: read from
their Secrets at each start, which are deleted with the stack) stay pulumi-random RandomPasswords,
which need no cluster access and are new after a destroy, everywhere at once.

Engine behaviour relied on (pulumi 3.272.0 sdk/python/lib/pulumi/dynamic/__main__.py, pulumi/pulumi
pkg/resource):
- Create runs once, when the resource enters the state: a stack that is deployed again after a
  destroy, and a stack upgraded from the RandomPassword resources this replaced (whose Secret exists,
  so its values are kept and the Secret does not change; the RandomPasswords leave the state).
- Preview never creates (the host's Configure answers without `supportsPreview`, so the engine does
  not call Create in a preview, pkg/resource/plugin/provider_plugin.go): a new KeptSecret's values are
  unknown in a preview, and the cluster is not read then (the CI preview may not read Secrets).
- Diff: every input replaces when it changes (they say what is read or generated), and the
  replacement's create reads the Secret again, so it keeps whatever the Secret holds then; an
  unchanged resource keeps its outputs (a same step, step.go `SameStep.Apply`).
- Refresh (`read`) keeps the outputs as they are: the values are what the stack applies, not a copy
  of the cluster (an edited Secret is taken on knowingly, docs/teardown-and-upgrades.md).
- Outputs are secret through `additional_secret_outputs` (the host returns plain values: its
  Configure answers acceptSecrets=False).
- Delete removes nothing: the Secret is Pulumi's own resource, kept by retainOnDelete.
"""
from __future__ import annotations

import base64
import json
import os
import re
import secrets
import string
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import pulumi
import pulumi.dynamic as dynamic

from components import kube_tunnel
from components.dynamic_provider import ProjectDynamicResource, ProjectProvider

ALPHABET = string.ascii_letters + string.digits
"""pulumi-random RandomPassword(special=False): upper, lower and numeric characters."""
BCRYPT_ROUNDS = 10
"""The cost of RandomPassword's bcryptHash (golang.org/x/crypto/bcrypt DefaultCost)."""
INPUTS = ("namespace", "name", "lengths", "htpasswd", "cluster", "context")
"""Every input; each one replaces when it changes (module docstring)."""
REQUEST_TIMEOUT_SECONDS = 30
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
SECRET_NAME = re.compile(r"^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$")
KEY = re.compile(r"^[-._a-zA-Z0-9]+$")


class KeptSecretError(Exception):
    """The kept Secret could not be read; str() names it and what to fix."""


@dataclass(frozen=True)
class Cluster:
    """Where kept Secrets are read: the stack's kube context (None: the current one, or in a pod its
    service account), as its Kubernetes provider reaches the cluster."""

    context: Optional[str] = None


@dataclass(frozen=True)
class Htpasswd:
    """An htpasswd file (key `key`) with one bcrypt entry for `username` and the value of `password_key`."""

    key: str
    username: str
    password_key: str


@dataclass(frozen=True)
class KeptSecretArgs:
    namespace: pulumi.Input[str]
    name: str
    """The Secret's name."""
    lengths: Mapping[str, int]
    """Generated keys -> their length."""
    cluster: Optional[Cluster]
    """None: no cluster to read (kubernetes.renderYamlToDirectory); every value is generated."""
    htpasswd: Optional[Htpasswd] = None


# --- pure functions ----------------------------------------------------------------------------


def generate(length: int) -> str:
    return "".join(secrets.choice(ALPHABET) for _ in range(length))


def htpasswd(username: str, bcrypt_hash: str) -> str:
    """An htpasswd file with one bcrypt entry (distribution accepts bcrypt only)."""
    return f"{username}:{bcrypt_hash}\n"


def htpasswd_verifies(text: str, username: str, password: str) -> bool:
    """Whether `text` is an htpasswd file of exactly one entry, `username`'s, whose bcrypt hash is of `password`."""
    import bcrypt

    lines = text.splitlines()
    user, _, hashed = lines[0].partition(":") if len(lines) == 1 else ("", "", "")
    if user != username or not hashed.startswith("$2"):
        return False
    try:
        return bcrypt.checkpw(password.encode(), hashed.encode())
    except ValueError:  # not a bcrypt hash after all
        return False


def bcrypt_htpasswd(username: str, password: str) -> str:
    import bcrypt

    return htpasswd(username, bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=BCRYPT_ROUNDS)).decode())


def decoded(namespace: str, name: str, data: Mapping[str, str]) -> dict[str, str]:
    """A Secret's `data` as text; a value that is not UTF-8 text cannot be a generated one."""
    values = {}
    for key, value in data.items():
        try:
            values[key] = base64.b64decode(value, validate=True).decode()
        except ValueError:
            raise KeptSecretError(f"Secret {namespace}/{name} key {key!r} is not base64 of UTF-8 text, so it was not "
                                  f"generated here; fix or remove that key") from None
    return values


def kept_values(kept: Mapping[str, str], lengths: Mapping[str, int], spec: Optional[Mapping[str, str]]) -> dict[str, str]:
    """The values to apply: each key of `lengths` as `kept` holds it (a non-empty value), else
    generated; then the htpasswd file of `spec` ({key, username, passwordKey}), kept when it
    verifies against the password, else computed."""
    values = {key: kept.get(key) or generate(int(length)) for key, length in sorted(lengths.items())}
    if spec:
        password = values[spec["passwordKey"]]
        current = kept.get(spec["key"]) or ""
        values[spec["key"]] = (current if htpasswd_verifies(current, spec["username"], password)
                               else bcrypt_htpasswd(spec["username"], password))
    return values


def props_of(args: KeptSecretArgs) -> dict:
    """The dynamic resource's inputs."""
    props: dict = {"namespace": args.namespace, "name": args.name,
                   "lengths": {key: int(length) for key, length in args.lengths.items()},
                   "cluster": args.cluster is not None}
    if args.htpasswd:
        props["htpasswd"] = {"key": args.htpasswd.key, "username": args.htpasswd.username,
                             "passwordKey": args.htpasswd.password_key}
    if args.cluster is not None and args.cluster.context:
        props["context"] = args.cluster.context
    return props


def _known(value: Any) -> bool:
    from pulumi.runtime import rpc

    return value != rpc.UNKNOWN


def problems(news: dict) -> list[tuple[str, str]]:
    """(input, reason) for each known input that is wrong; unknown (preview) values are skipped."""
    found = []
    for key, pattern in (("namespace", DNS_LABEL), ("name", SECRET_NAME)):
        value = news.get(key)
        if _known(value) and not (isinstance(value, str) and pattern.match(value) and len(value) <= 253):
            found.append((key, f"must be a Kubernetes object name, got {value!r}"))
    lengths = news.get("lengths")
    if _known(lengths) and not (isinstance(lengths, dict) and lengths and all(
            isinstance(k, str) and KEY.match(k) and isinstance(v, (int, float)) and not isinstance(v, bool)
            and v == int(v) and 16 <= v <= 256 for k, v in lengths.items())):
        found.append(("lengths", f"must map Secret keys to lengths from 16 to 256, got {lengths!r}"))
    spec = news.get("htpasswd")
    if spec is not None and _known(spec) and not (
            isinstance(spec, dict) and all(isinstance(spec.get(k), str) and spec[k] for k in ("key", "username", "passwordKey"))
            and isinstance(lengths, dict) and spec["passwordKey"] in lengths and spec["key"] not in lengths):
        found.append(("htpasswd", f"must be {{key, username, passwordKey}} with passwordKey one of lengths' keys, got {spec!r}"))
    return found


# --- the cluster -------------------------------------------------------------------------------


def read_secret(namespace: str, name: str, context: Optional[str], env: Mapping[str, str] = os.environ,
                service_account_dir: str = kube_tunnel.SERVICE_ACCOUNT_DIR) -> Optional[dict[str, str]]:
    """The Secret's values as text, or None when it does not exist (nor its namespace: the API
    server answers a GET in a missing namespace with the same 404)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    kubeconfig = kube_tunnel.kubeconfig_path(env)
    where = kube_tunnel.source_text(kubeconfig, context, env, service_account_dir)
    what = f"Secret {namespace}/{name}, whose values a kept store or registry needs ({where})"
    try:
        configuration = kube_tunnel.load_configuration(kubeconfig, context, env, service_account_dir)
    except kube_tunnel.TunnelError as error:
        raise KeptSecretError(f"cannot read {what}: {error}") from None
    core = client.CoreV1Api(client.ApiClient(configuration))
    try:
        answer = core.read_namespaced_secret(name, namespace, _preload_content=False,
                                             _request_timeout=REQUEST_TIMEOUT_SECONDS)
        body = json.loads(answer.data)
    except ApiException as error:
        status = kube_tunnel.status_of(error)
        if status == 404:
            return None
        hint = f": `pulumi up` needs `get` on secrets in namespace {namespace}" if status == 403 else ""
        raise KeptSecretError(f"cannot read {what}: HTTP {status} {kube_tunnel.message_of(error)}{hint}") from None
    except (OSError, ValueError, HTTPError) as error:  # refused, timed out, TLS, not JSON
        raise KeptSecretError(f"cannot read {what}: {type(error).__name__}: {str(error)[:200]}") from None
    finally:
        core.api_client.close()
    return decoded(namespace, name, body.get("data") or {})


# --- the provider ------------------------------------------------------------------------------


class KeptSecretProvider(ProjectProvider):
    """Values of a kept Secret (module docstring); id `<namespace>/<name>`."""

    def problems(self, news: dict[str, Any]) -> list[tuple[str, str]]:
        return problems(news)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        # `olds` are the previous outputs, which repeat the inputs (create).
        replaces = [key for key in INPUTS if olds.get(key) != news.get(key)]
        return dynamic.DiffResult(changes=bool(replaces), replaces=replaces, delete_before_replace=False)

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        failures = problems(props)
        if failures:
            raise KeptSecretError("; ".join(f"{key} {reason}" for key, reason in failures))
        namespace, name = props["namespace"], props["name"]
        kept = read_secret(namespace, name, props.get("context") or None) if props.get("cluster") else None
        values = kept_values(kept or {}, props["lengths"], props.get("htpasswd"))
        return dynamic.CreateResult(id_=f"{namespace}/{name}", outs={**props, "values": values})

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        return dynamic.ReadResult(id_=id_, outs=props)

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        """Nothing: the Secret is the kept thing (module docstring)."""


class KeptSecret(ProjectDynamicResource, module="secrets", name="KeptSecret"):
    """The values to apply in a kept Secret (type `pulumi-python:dynamic/secrets:KeptSecret`):
    `values` (secret Output of {key: value}); `value(key)` is one of them."""

    values: pulumi.Output[dict]

    def __init__(self, name: str, args: KeptSecretArgs, opts: Optional[pulumi.ResourceOptions] = None):
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=["values"]))
        super().__init__(KeptSecretProvider(), name, {**props_of(args), "values": None}, opts)

    def value(self, key: str) -> pulumi.Output[str]:
        return pulumi.Output.secret(self.values).apply(lambda values: values[key])
