"""One entity's image, built inside the cluster as an Armada job (issue 13, `builds.mode: armada`).

`EntityBuild` (type `cloudstation:builds:EntityBuild`) wraps one dynamic resource
(`pulumi-python:dynamic/builds:EntityBuild`) whose provider makes sure the image
`<repository>:<contentTag>` exists in the registry and returns its digest:

1. the registry already has the tag -> its digest, no job (an unchanged entity costs one HEAD), but
   only where that tag can only have come from this project's own build (`adoptExisting`, see
   "Digests are never switched silently" below);
2. else the provider recomputes the context tar (components/build_context.py) and checks its digest
   against `contextDigest`, the one the program put in the job's pod spec; uploads it as an OCI
   artifact (`contextRepository:<contentTag>`, blobs the registry already has are not sent again);
   submits the job item (`jobItem`, the full pod spec as JSON text, an input so the offline render
   shows what will run; see `job_item_text`) to `queue` / `jobSetId` over Armada's REST API; polls
   its state every `pollSeconds`, at most `timeoutSeconds`, logging each state change (the
   `pulumi up` display shows it);
3. a failed job raises an error with Armada's error text for it (`/v1/job/errors`: the test
   output) and, when `binocularsUrl` is set, the pod's last log lines; a job still running at the
   timeout is cancelled (best effort) and the error says so; a job REJECTED only because no
   executor had reported a node to the scheduler yet (a fresh install) is submitted again until
   the timeout (`_run_job`);
4. the digest is read from the registry (HEAD of the tag), never taken from the job.

Engine behaviour relied on (pulumi 3.272.0 as installed, pulumi/pulumi source at the nearest stored):
- Preview submits nothing: the dynamic-provider host answers Configure without `supportsPreview`
  (sdk/python/lib/pulumi/dynamic/__main__.py `Configure`), so in a preview the engine returns the
  inputs from Create/Update without calling the provider (pkg/resource/plugin/provider_plugin.go
  `Create`/`Update`: `if req.Preview ... !protocol.supportsPreview`); only Check and Diff run, and
  neither touches the network here.
- Secrets stay secret: outputs repeat the inputs (the provider needs the credentials on refresh),
  and the engine marks an output secret when the input of the same name was
  (provider_plugin.go `annotateSecrets` after Create, Read and Update).
- Refresh: `read` answers an empty id when the registry no longer has the tag; the engine then
  treats the resource as deleted (pkg/resource/deploy/step.go RefreshStep.Apply, "If the ID is
  blank treat this as a delete"), and the next `pulumi up` creates it again, i.e. rebuilds.
- Diff: only `contentTag` and `builder` replace (a new image; the builder is hashed into the
  content tag, infra/builds.py `builder`, so the replacement's tag is one the registry lacks and
  the create builds, never finding the old builder's image). A change of how the registry is
  reached (`registryUrl`, `registryTunnel`, `registryAuthorization`, `REGISTRY_ACCESS_INPUTS`) is an
  update without replacement: a same step keeps the OLD outputs (pkg/resource/deploy/step.go
  `SameStep.Apply`: `s.new.Outputs = s.old.Outputs`) and `pulumi refresh` hands those to `read`
  (dynamic/__main__.py `Read`: "On refresh the engine passes prior outputs"), so without the update
  a refresh would still go to the old address (e.g. a stack built before the tunnel existed, at
  http://localhost:32000). The update finds the tag (one HEAD, no job) and rewrites the outputs.
  Any other change (Armada URLs, poll settings, even the pod spec's formatting) is no change, and
  the engine records the new inputs with the old outputs (a same step).

The registry API (tag check, context upload, digest) is reached at `registryUrl`, or, with
`registryTunnel`, through a port-forward through the Kubernetes API to a Ready registry pod
(components/kube_tunnel.py): no port-forward on the deployer's machine (docs/builds.md).

Digests are never switched silently (issue 20 item 3). The state records the digest a build
produced; a tag that later resolves to another digest (on `pulumi refresh`, or an update such as a
change of registry access) is an error naming both, and nothing changes. On create an existing tag
is taken only with `adoptExisting`, which the program sets for the managed registry alone
(infra/builds.py), because there the tag's only possible writer is a build of the same project:
the gate in front of it (components/registry_gate.py, policy of components/registry_access.py)
lets `<project>/*` be pushed by that project's build user only, never another project's or a pull
user, tags are create-only for it, and the deployer's user may not write a content tag
(`<32 hex>`) with in-cluster builds; distribution itself listens on the pod's loopback only. So an
existing `<project>/<entity>:<content tag>` was pushed by a build of `<project>` (of this entity,
or, by its own project's code, of another of its entities), never by another tenant. Elsewhere (an
external registry, whose rights this program does not set) an existing tag is refused.

Delete removes nothing: images are shared by digest with prod (promotion tags them, it does not
copy them), and a rollback needs old images. The managed registry has API deletes off
(components/registry.py), so clean-up happens on its volume: remove old tags and the build contexts
under `builds/` (never needed once their image exists), run the registry's garbage collection with
the registry read-only or stopped, then restart it, since its in-memory blob-descriptor cache would
otherwise still report freed blobs and `_upload_context` would skip a context upload
(docs/builds.md, "Image clean-up").

Submissions carry a deterministic `clientId` (`client_id`): a repeated or interrupted `pulumi up`
waits for the job already building, and an earlier job that ended without the image is followed by
a new attempt (`EntityBuildProvider._submit`).
"""
from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pulumi
import pulumi.dynamic as dynamic

from components.component import Component
from components.dynamic_provider import ProjectDynamicResource, ProjectProvider

CONTEXT_ANNOTATION = "cloudstation.io/build-context"
IMAGE_ANNOTATION = "cloudstation.io/build-image"
REPLACING_INPUTS = ("contentTag", "builder")
"""The only inputs whose change builds again (a new content hash, or other build settings)."""
REGISTRY_ACCESS_INPUTS = ("registryUrl", "registryTunnel", "registryAuthorization")
"""Inputs whose change is an update (no build when the tag exists), so `read` gets the new ones."""
REQUIRED_INPUTS = (
    "contentTag", "contextDigest", "contextDir", "dockerfileText", "repository", "pullHost", "registryUrl",
    "armadaUrl", "queue", "jobSetId", "jobItem", "timeoutSeconds", "pollSeconds",
)
SECRET_INPUTS = ("registryAuthorization", "armadaAuthorization")
REQUEST_TIMEOUT_SECONDS = 30
"""One HTTP request to the registry or Armada."""
CONNECT_WAIT_SECONDS = 30
"""How long a request retries an unreachable Armada (capped by the build's timeout)."""
LOG_TAIL_LINES = 200
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
TAG = re.compile(r"\w[\w.-]{0,127}", re.ASCII)


class BuildFailed(Exception):
    """The build did not produce the image; str() says why (job errors, logs, timeout)."""


def log(message: str, severity: str = "info") -> None:
    """Progress through pulumi.log (the dynamic-provider host has no engine connection, and the SDK
    then writes to stderr, which the engine shows as the plugin's output: pulumi/pulumi
    sdk/go/common/resource/plugin/plugin.go `runtrace`); never fails the build."""
    try:
        getattr(pulumi.log, severity)(message)
    except Exception:  # noqa: BLE001 - outside an engine, or the engine is gone: keep building
        print(f"{severity}: {message}", file=sys.stderr, flush=True)


def _known(value: Any) -> bool:
    """False for a value the engine does not know yet (a preview's unknowns)."""
    from pulumi.runtime import rpc

    return value is not None and value != rpc.UNKNOWN


def image_ref(pull_host: str, repository: str, tag: str, digest: str) -> str:
    """`<pullHost>/<repository>:<tag>@sha256:...`, as EntityImage.ref."""
    return f"{pull_host}/{repository}:{tag}@{digest}"


def annotated_context(item: Any) -> Optional[tuple[str, str]]:
    """(repository below the host, digest) of the job item's build-context annotation."""
    annotations = item.get("annotations") if isinstance(item, dict) else None
    value = annotations.get(CONTEXT_ANNOTATION) if isinstance(annotations, dict) else None
    if not isinstance(value, str) or "@" not in value or "/" not in value:
        return None
    name, _, digest = value.rpartition("@")
    return name.split("/", 1)[1], digest


def job_item_text(item: dict) -> str:
    """The job item as the `jobItem` input carries it: JSON text (sorted keys, compact), the exact
    body the provider submits (plus its `clientId`). Not a nested map, for two engine reasons:
    - Numbers: a map's numbers reach the provider as doubles (pulumi 3.272.0
      sdk/python/lib/pulumi/runtime/rpc.py `serialize_property`: `struct_pb2.Value(number_value=
      float(value))`), and Armada's gateway (Go encoding/json) refuses 1800.0 for an integer field
      (activeDeadlineSeconds, runAsUser, defaultMode); text keeps 1800.
    - Cost: one string crosses the engine's serialization (program -> engine -> state -> provider)
      instead of ~300 nested values per build; at 500 entities that was the largest share of the
      render (bench/render_cost.py).
    The Pulumi CLI shows a JSON-text property's diff as a structured diff (pulumi/pulumi#5831), and
    `python -m infra render` shows the text in resources.json (docs/builds.md, "What a build runs")."""
    return json.dumps(item, sort_keys=True, separators=(",", ":"))


def job_item_of(props: dict) -> dict:
    """The `jobItem` input, parsed (`job_item_text`)."""
    return json.loads(props["jobItem"])


def context_repository_of(props: dict) -> str:
    return props.get("contextRepository") or (annotated_context(job_item_of(props)) or ("", ""))[0]


def problems(news: dict) -> list[tuple[str, str]]:
    """(input, reason) for every known input that is wrong; unknown (preview) values are skipped."""
    found = []
    for key in REQUIRED_INPUTS:
        if key not in news or (news[key] in ("", None) and _known(news.get(key, ""))):
            found.append((key, "is required"))

    def known(key: str) -> bool:
        return key in news and _known(news[key]) and news[key] not in ("", None)

    if known("contentTag") and not (isinstance(news["contentTag"], str) and TAG.fullmatch(news["contentTag"])):
        found.append(("contentTag", f"must be an image tag, got {news['contentTag']!r}"))
    if known("contextDigest") and not (isinstance(news["contextDigest"], str) and DIGEST.fullmatch(news["contextDigest"])):
        found.append(("contextDigest", f"must be sha256:<64 hex digits>, got {news['contextDigest']!r}"))
    for key in ("registryUrl", "armadaUrl", "binocularsUrl"):
        if known(key) and not re.fullmatch(r"https?://[^\s/]+/?", str(news[key])):
            found.append((key, f"must be http(s)://host[:port], got {news[key]!r}"))
    for key in ("timeoutSeconds", "pollSeconds"):
        if known(key) and not (isinstance(news[key], (int, float)) and not isinstance(news[key], bool) and news[key] > 0):
            found.append((key, f"must be a positive number of seconds, got {news[key]!r}"))
    tunnel = tunnel_problem(news["registryTunnel"]) if known("registryTunnel") else None
    if tunnel:
        found.append(("registryTunnel", tunnel))
    if known("jobItem"):
        try:
            item = json.loads(news["jobItem"]) if isinstance(news["jobItem"], str) else None
        except ValueError:
            item = None
        if not isinstance(item, dict) or not isinstance(item.get("podSpec"), dict):
            found.append(("jobItem", "must be the JSON text of an apiJobSubmitRequestItem with a podSpec"))
        else:
            annotated = annotated_context(item)
            if annotated is None:
                found.append(("jobItem", f"needs the annotation {CONTEXT_ANNOTATION}: <host>/<repository>@sha256:..."))
            elif known("contextDigest") and _known(annotated[1]) and annotated[1] != news["contextDigest"]:
                found.append(("jobItem", f"{CONTEXT_ANNOTATION} names {annotated[1]}, not contextDigest "
                                         f"{news['contextDigest']}: the pod would fetch another context"))
            elif known("contextRepository") and _known(annotated[0]) and annotated[0] != news["contextRepository"]:
                found.append(("contextRepository", f"{news['contextRepository']!r} is not the repository the job "
                                                   f"fetches from ({annotated[0]!r}, {CONTEXT_ANNOTATION})"))
    return found


MAX_ATTEMPTS = 50
"""Earlier jobs of one content that ended without the image, after which a build gives up."""
EARLIER_MARGIN_SECONDS = 30.0
"""A job counts as an earlier `pulumi up`'s only when created this much before the submission
reached the server: room for clocks of a proxy (whose `Date` the answer may carry) and the server
to differ. A job that fails within this margin of being submitted was not an earlier run's anyway."""


def client_id(props: dict, attempt: int = 1) -> str:
    """The job's `clientId` (apiJobSubmitRequestItem, at most 100 characters: v0.22.7
    submit_request.go validateClientId): the content tag, a digest of the repository, tag, context
    digest and builder (entities sharing a source share a tag but not a repository; the builder is
    in the tag too, infra/builds.py `builder`, and here as well so that no job of another builder
    is ever handed back), and the attempt. Deterministic, so a re-run submits the same id; a new
    content tag or builder is a new id."""
    import hashlib

    builder = json.dumps(props.get("builder") or {}, sort_keys=True, separators=(",", ":"))
    key = "\n".join([props["repository"], props["contentTag"], props["contextDigest"], builder])
    return f"{props['contentTag'][:63]}.{hashlib.sha256(key.encode()).hexdigest()[:16]}.{attempt}"


def is_earlier_job(job_id: str, server_time: Optional[float], request_seconds: float) -> bool:
    """Whether the submit answer's `job_id` existed before the request reached the server: its
    ULID time is earlier than the answer's `Date` (the server's clock, whole seconds, never after
    the answer) less the request's round trip and EARLIER_MARGIN_SECONDS. Without a `Date` or a
    ULID the job is taken as new (the build then fails or succeeds on its own)."""
    from components.armada.jobs_api import job_id_time

    created = job_id_time(job_id)
    if created is None or server_time is None:
        return False
    return created < server_time - request_seconds - EARLIER_MARGIN_SECONDS


# --- the provider -------------------------------------------------------------------------------


def tunnel_problem(tunnel: Any) -> Optional[str]:
    """Why `registryTunnel` ({namespace, selector, port[, context]}) is unusable, or None."""
    port = tunnel.get("port") if isinstance(tunnel, dict) else None
    selector = tunnel.get("selector") if isinstance(tunnel, dict) else None
    if not (isinstance(tunnel, dict) and isinstance(tunnel.get("namespace"), str) and tunnel["namespace"]
            and isinstance(selector, dict) and selector and all(isinstance(v, str) for v in selector.values())
            and isinstance(port, (int, float)) and not isinstance(port, bool) and port == int(port) and 0 < port < 65536
            and isinstance(tunnel.get("context") or "", str)):
        return f"must be {{namespace, selector: {{label: value}}, port[, context]}}, got {tunnel!r}"
    return None


def moved_problem(props: dict, digest: str, recorded: Optional[str]) -> Optional[str]:
    """Why a tag resolving to `digest` cannot be taken when the state records `recorded` (None: nothing
    recorded yet), or None."""
    if recorded is None or digest == recorded:
        return None
    image = f"{props['repository']}:{props['contentTag']}"
    return (f"{image}: the registry's tag now resolves to {digest}, but this stack built and recorded {recorded}; "
            "a digest is never switched silently, so nothing was changed. Someone moved the tag: find out who "
            "(the registry gate's log names the user of every write), then remove the tag from the registry's storage "
            "(docs/builds.md, \"Image clean-up\") so that the next `pulumi up` builds it again")


def foreign_problem(props: dict, digest: str) -> Optional[str]:
    """Why an existing tag found on create cannot be taken (no `adoptExisting`: this registry's rights
    do not make the project's own builds the tag's only possible writer), or None."""
    if props.get("adoptExisting"):
        return None
    image = f"{props['repository']}:{props['contentTag']}"
    return (f"{image} is already in the registry at {props['registryUrl']} ({digest}) before this stack built it, "
            "and this registry's rights do not make the project's own builds its only possible writer (adoptExisting "
            "is off): refusing to deploy an image whose build and tests this stack did not see. Remove the tag and "
            "run `pulumi up` again to build it")


def _registry(props: dict):
    """The registry client: through `registryTunnel` (a port-forward through the Kubernetes API to
    a Ready registry pod, components/kube_tunnel.py; `registryUrl` then only names the Host) when
    set, else straight to `registryUrl`. No request and its answer outlast the build's timeout
    (`timeoutSeconds`), however slowly the registry answers."""
    from components import kube_tunnel, registry_api

    authorization = props.get("registryAuthorization")
    credentials = registry_api.Credentials.from_basic(authorization) if authorization else None
    dial = kube_tunnel.dialer(props.get("registryTunnel"), timeout=REQUEST_TIMEOUT_SECONDS)
    return registry_api.for_url(props["registryUrl"], credentials, timeout=REQUEST_TIMEOUT_SECONDS, dial=dial,
                                exchange_timeout=float(props["timeoutSeconds"]))


def _jobs(props: dict, wait: float):
    from components.armada.jobs_api import JobsClient

    headers = {"Authorization": props["armadaAuthorization"]} if props.get("armadaAuthorization") else {}
    return JobsClient(props["armadaUrl"], timeout=REQUEST_TIMEOUT_SECONDS, wait_seconds=wait, headers=headers,
                      retry_interval=min(2.0, max(wait / 4, 0.05)))


class EntityBuildProvider(ProjectProvider):
    """Ensures `<repository>:<contentTag>` exists (see the module docstring); id `<repository>:<tag>`."""

    def problems(self, news: dict[str, Any]) -> list[tuple[str, str]]:
        return problems(news)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        # `olds` are the previous outputs (dynamic/__main__.py `Diff`), which repeat the inputs; both
        # sides arrive without secret wrappers (its `Configure` answers acceptSecrets=False).
        replaces = [key for key in REPLACING_INPUTS if olds.get(key) != news.get(key)]
        access = any(olds.get(key) != news.get(key) for key in REGISTRY_ACCESS_INPUTS)
        return dynamic.DiffResult(changes=bool(replaces) or access, replaces=replaces, delete_before_replace=False)

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        outs = self._ensure(props)
        return dynamic.CreateResult(id_=f"{props['repository']}:{props['contentTag']}", outs=outs)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        return dynamic.UpdateResult(outs=self._ensure(news, recorded=olds.get("digest") or None))

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        repository, tag = props["repository"], props["contentTag"]
        with _registry(props) as registry:
            digest = registry.manifest_digest(repository, tag)
        if digest is None:
            log(f"{repository}:{tag} is no longer in the registry; the next `pulumi up` builds it again", "warn")
            return dynamic.ReadResult(id_="", outs={})
        moved = moved_problem(props, digest, props.get("digest") or None)
        if moved:
            raise BuildFailed(moved)
        return dynamic.ReadResult(id_=id_, outs={**props, "digest": digest,
                                                 "ref": image_ref(props["pullHost"], repository, tag, digest)})

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        """Nothing: images stay in the registry (see the module docstring for clean-up)."""

    # --- create/update ----------------------------------------------------------------------------

    def _ensure(self, props: dict[str, Any], recorded: Optional[str] = None) -> dict[str, Any]:
        """Create (`recorded` None) or update (`recorded`: the digest the state holds)."""
        failures = problems(props)
        if failures:
            raise BuildFailed("; ".join(f"{key} {reason}" for key, reason in failures))
        repository, tag = props["repository"], props["contentTag"]
        image = f"{repository}:{tag}"
        # Closed when done: one provider process serves every build of a `pulumi up`, and each kept-alive
        # tunnelled connection holds file descriptors (select() in the port-forward relay fails past 1023).
        with _registry(props) as registry:
            digest = registry.manifest_digest(repository, tag)
            job_id = ""
            if digest is not None:
                refused = moved_problem(props, digest, recorded) or (None if recorded else foreign_problem(props, digest))
                if refused:
                    raise BuildFailed(refused)
                log(f"{image}: already in the registry ({digest}), nothing to build")
            else:
                self._upload_context(props, registry)
                job_id = self._run_job(props, registry)
                digest = registry.manifest_digest(repository, tag)
                if digest is None:
                    raise BuildFailed(f"{image}: Armada job {job_id} succeeded but the registry at {props['registryUrl']} "
                                      f"has no tag {tag} in {repository}: did the job push to {props.get('pushRef')}?")
        return {**props, "digest": digest, "ref": image_ref(props["pullHost"], repository, tag, digest), "jobId": job_id}

    def _upload_context(self, props: dict, registry) -> None:
        from components import build_context

        context = Path(props["contextDir"])
        tar = build_context.context_tar(context, props["dockerfileText"])
        digest = build_context.context_digest(tar)
        if digest != props["contextDigest"]:
            raise BuildFailed(
                f"the build context {context} changed after the program computed its digest (now {digest}, the job "
                f"expects {props['contextDigest']}); run `pulumi up` again"
            )
        repository, tag = context_repository_of(props), props["contentTag"]
        blobs = [(build_context.descriptor(build_context.OCI_EMPTY, build_context.EMPTY_CONFIG)["digest"],
                  build_context.EMPTY_CONFIG), (digest, tar)]
        for blob_digest, data in blobs:
            if registry.blob_exists(repository, blob_digest):
                continue
            registry.upload_blob(repository, blob_digest, data)
            if blob_digest == digest:
                log(f"{repository}: uploaded the build context ({len(tar)} bytes, {digest})")
        manifest = build_context.context_manifest(digest, len(tar))
        registry.put_manifest(repository, tag, manifest, build_context.OCI_MANIFEST)

    def _submit(self, props: dict, client, registry, first: int = 1) -> tuple[str, int]:
        """Submit the build with a deterministic `clientId` (`client_id`, attempts from `first`) and
        return the job to wait for and its attempt. Armada answers a clientId it has seen in the queue with the original job's id
        (v0.22.7 internal/server/submit/submit.go SubmitJobs, deduplicaton.go: key
        `<queue>:<clientId>` in the lookout database's job_deduplication table, pruned after the
        lookout pruner's `deduplicationExpireAfter`, 168h by default), so a `pulumi up` that was
        interrupted, or runs while an earlier one's job still runs, waits for that job instead of
        building twice. An original that already ended without the image (a failed test, a
        cancel) is not waited for: the next attempt (clientId suffix) builds again. A job is an
        original when its id (a ULID) was stamped before this request reached the server
        (`is_earlier_job`)."""
        from components.armada.jobs_api import FAILED_STATES, SUCCEEDED

        image = f"{props['repository']}:{props['contentTag']}"
        queue, job_set = props["queue"], props["jobSetId"]
        for attempt in range(first, MAX_ATTEMPTS + 1):
            item = {**job_item_of(props), "clientId": client_id(props, attempt)}
            started = time.monotonic()
            (job_id,), server_time = client.submit_timed(queue, job_set, [item])
            if not is_earlier_job(job_id, server_time, time.monotonic() - started):
                log(f"{image}: submitted Armada job {job_id} (queue {queue}, job set {job_set}, client id {item['clientId']})")
                return job_id, attempt
            state = client.status([job_id])[job_id]
            ended_without_image = state in FAILED_STATES or (
                state == SUCCEEDED and registry is not None
                and registry.manifest_digest(props["repository"], props["contentTag"]) is None)
            if not ended_without_image:
                log(f"{image}: Armada job {job_id} of an earlier `pulumi up` builds it (client id {item['clientId']}, "
                    f"{state}); waiting for it")
                return job_id, attempt
            log(f"{image}: Armada job {job_id} of an earlier `pulumi up` ended {state} without the image (client id "
                f"{item['clientId']}); building again")
        raise BuildFailed(f"{image}: {MAX_ATTEMPTS} earlier Armada jobs of this content all ended without the image "
                          f"(client ids {client_id(props, 1)} to {client_id(props, MAX_ATTEMPTS)} in queue {queue}); "
                          "change the entity or wait for Armada to forget them (lookout pruner, deduplicationExpireAfter)")

    def _run_job(self, props: dict, registry=None) -> str:
        """Submit (`_submit`) and wait for the job, at most `timeoutSeconds`. A job REJECTED only
        because no executor had reported a node to the scheduler yet (a fresh install: Armada's
        submit check sees the executors as of its last snapshot, refreshed every
        `executorUpdateFrequency`, components/armada/config.py EXECUTOR_UPDATE_FREQUENCY;
        jobs_api.rejected_for_no_nodes) is submitted again as the next attempt after `pollSeconds`,
        until the timeout; every other rejection fails the build with Armada's text."""
        from components.armada.jobs_api import FAILED_STATES, SUCCEEDED, rejected_for_no_nodes

        timeout, poll = float(props["timeoutSeconds"]), float(props["pollSeconds"])
        deadline = time.monotonic() + timeout
        image = f"{props['repository']}:{props['contentTag']}"
        client = _jobs(props, wait=min(CONNECT_WAIT_SECONDS, timeout))
        queue, job_set = props["queue"], props["jobSetId"]
        job_id, attempt = self._submit(props, client, registry)
        state, last_error = None, None
        while True:
            try:
                current = client.status([job_id])[job_id]
                last_error = None
            except Exception as error:  # noqa: BLE001 - a blip while polling is not a failed build
                current, last_error = state, error
                log(f"{image}: cannot read job {job_id}'s state yet: {error}", "warn")
            if current != state and current is not None:
                log(f"{image}: job {job_id} is {current}")
                state = current
            if state == SUCCEEDED:
                return job_id
            if state in FAILED_STATES:
                text = self._error_text(props, client, job_id)
                waiting = state == "REJECTED" and rejected_for_no_nodes(text)
                if not waiting or time.monotonic() + poll > deadline:
                    hint = (f"no executor reported a node to Armada's scheduler within {timeout:g} s (timeoutSeconds): "
                            "check that the executors run and reach the scheduler (`kubectl -n <armada namespace> get "
                            "pods`, the executor's log)") if waiting else ""
                    raise BuildFailed(self._failure_text(props, job_id, state, text, hint))
                log(f"{image}: Armada job {job_id} was rejected: no executor had reported a node to Armada's scheduler "
                    f"yet (its submit check sees them every executorUpdateFrequency); submitting again in {poll:g} s",
                    "warn")
                time.sleep(poll)
                job_id, attempt = self._submit(props, client, registry, attempt + 1)
                state = None
                continue
            if time.monotonic() + poll > deadline:
                break
            time.sleep(poll)
        cancelled = ""
        try:
            client.cancel(queue, job_set, job_id, f"pulumi up gave up after {timeout:g} s")
            cancelled = "; it was cancelled"
        except Exception as error:  # noqa: BLE001 - best effort
            cancelled = f"; cancelling it failed ({error})"
        why = f" (last poll failed: {last_error})" if last_error else ""
        raise BuildFailed(
            f"{image}: timed out after {timeout:g} s (timeoutSeconds) waiting for Armada job {job_id} in queue "
            f"{queue}, last state {state or 'not known'}{why}{cancelled}. Watch it with lookout or "
            f"`armadactl watch {queue} {job_set}` (docs/builds.md, a stuck job)"
        )

    def _error_text(self, props: dict, client, job_id: str) -> str:
        """Armada's error text for a job that ended without success ("" when none is recorded)."""
        from components.armada.jobs_api import failure_reason

        try:
            text = client.errors([job_id])[job_id]
        except Exception as error:  # noqa: BLE001 - still report the failure
            text = f"(reading /v1/job/errors failed: {error})"
        if not text.strip():
            try:  # the error may not be in lookout yet: the job set's failed event has the reason
                text = failure_reason(client.job_set_events(props["queue"], props["jobSetId"]), job_id) or ""
            except Exception:  # noqa: BLE001
                text = ""
        return text

    def _failure_text(self, props: dict, job_id: str, state: str, text: str, hint: str = "") -> str:
        image = f"{props['repository']}:{props['contentTag']}"
        parts = [f"{image}: Armada job {job_id} {state}" + (f": {hint}" if hint else "")]
        parts.append(f"job error:\n{text.strip() or '(Armada recorded no error text)'}")
        if props.get("binocularsUrl"):
            parts.append(self._logs(props, job_id))
        return "\n".join(parts)

    def _logs(self, props: dict, job_id: str) -> str:
        from components.armada.jobs_api import BinocularsClient

        headers = {"Authorization": props["armadaAuthorization"]} if props.get("armadaAuthorization") else {}
        try:
            lines = BinocularsClient(props["binocularsUrl"], timeout=REQUEST_TIMEOUT_SECONDS, headers=headers).logs(
                job_id, job_item_of(props).get("namespace", ""), LOG_TAIL_LINES)
        except Exception as error:  # noqa: BLE001 - the job error is reported anyway
            return f"pod log: not available ({error})"
        return f"pod log (last {LOG_TAIL_LINES} lines):\n" + "\n".join(lines)


# --- the component ------------------------------------------------------------------------------


@dataclass(frozen=True)
class EntityBuildArgs:
    """One entity's in-cluster build: what to build, where the job runs, where the image goes."""

    context_dir: str
    """Build context directory relative to the program's working directory (infra/), as
    EntityImageArgs.context; the provider re-reads it at create."""
    dockerfile_text: str
    content_tag: str
    """The image tag: `entity_image.content_tag(context, dockerfile_text, builder)`."""
    context_digest: str
    """`build_context.context_digest(build_context.context_tar(context, dockerfile_text))`."""
    repository: str
    """The image's repository below the registry host, e.g. `shop/cart`."""
    context_repository: str
    """Where the context artifact goes: `build_context.context_repository(prefix, project, entity)`;
    must be the repository of the job item's `cloudstation.io/build-context` annotation."""
    push_ref: str
    """`<in-cluster registry host>/<repository>:<tag>`, the job's push target (for messages)."""
    pull_host: str
    """host[:port] the kubelet pulls from (the `ref` output names it)."""
    registry_url: str
    """`http(s)://host[:port]` of the registry API as `pulumi up` reaches it (with `registry_tunnel`,
    `http://<service host>:<port>`: only the Host header)."""
    registry_authorization: pulumi.Input[str]
    """`Basic <base64 user:password>` for the registry API (a secret)."""
    armada_url: str
    """`http(s)://host[:port]` of Armada's REST API as `pulumi up` reaches it."""
    armada_authorization: pulumi.Input[str]
    """`Basic <base64 user:password>` of the Armada user that submits (a secret)."""
    queue: str
    """`<project>-builds`."""
    job_set_id: str
    """`<project>-<stack>`."""
    job_item: pulumi.Input[dict]
    """The `apiJobSubmitRequestItem` (components/build_job.py), pod spec included; the input carries
    it as JSON text (`job_item_text`)."""
    builder: dict = field(default_factory=dict)
    """What builds the image (infra/builds.py `builder`: the pinned builder and fetch images); it is
    hashed into `content_tag` too, so a change is a new tag that the registry lacks: a build."""
    timeout_seconds: int = 1800
    poll_seconds: float = 5
    binoculars_url: str = ""
    """Binoculars' REST URL, to add the pod's log to a failed build's error ("" for none)."""
    registry_tunnel: Optional[dict] = None
    """`{namespace, selector, port[, context]}`: reach the registry API through a port-forward
    through the Kubernetes API to a Ready pod matching `selector` (components/kube_tunnel.py), no
    listener on this machine; None: straight to `registry_url`. Not a replacing input."""
    adopt_existing: bool = False
    """On create, take a tag the registry already has: only where the registry's rights make this
    project's own builds its only possible writer (the managed registry's gate; module docstring)."""


def build_props(args: EntityBuildArgs) -> dict:
    """The dynamic resource's inputs (names as in the issue 13 contract, seam 4)."""
    props = {
        "contentTag": args.content_tag,
        "contextDigest": args.context_digest,
        "contextDir": args.context_dir,
        "dockerfileText": args.dockerfile_text,
        "repository": args.repository,
        "contextRepository": args.context_repository,
        "pushRef": args.push_ref,
        "pullHost": args.pull_host,
        "registryUrl": args.registry_url,
        "registryAuthorization": pulumi.Output.secret(args.registry_authorization),
        "armadaUrl": args.armada_url,
        "armadaAuthorization": pulumi.Output.secret(args.armada_authorization),
        "queue": args.queue,
        "jobSetId": args.job_set_id,
        "jobItem": (args.job_item.apply(job_item_text) if isinstance(args.job_item, pulumi.Output)
                    else job_item_text(args.job_item)),
        "builder": args.builder,
        "timeoutSeconds": args.timeout_seconds,
        "pollSeconds": args.poll_seconds,
    }
    if args.binoculars_url:
        props["binocularsUrl"] = args.binoculars_url
    if args.registry_tunnel:
        props["registryTunnel"] = args.registry_tunnel
    if args.adopt_existing:
        props["adoptExisting"] = True
    return props


class EntityBuildResource(ProjectDynamicResource, module="builds", name="EntityBuild"):
    """The dynamic resource (type `pulumi-python:dynamic/builds:EntityBuild`), registered as
    `dynamic.Resource` registers it, its provider serialized once per process (components/dynamic_provider.py)."""

    # Attributes named as the outputs (dynamic resources translate no property names).
    digest: pulumi.Output[str]
    ref: pulumi.Output[str]
    jobId: pulumi.Output[str]

    def __init__(self, name: str, props: dict, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(EntityBuildProvider(), name, {**props, "digest": None, "ref": None, "jobId": None}, opts)


class EntityBuild(Component):
    """An entity image built in the cluster. Outputs: `ref` (digest-pinned, as EntityImage.ref)
    and `digest`."""

    def __init__(self, name: str, args: EntityBuildArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("cloudstation:builds:EntityBuild", name, None, opts)
        build = EntityBuildResource(f"{name}-build", build_props(args), self.child_opts())
        self.ref: pulumi.Output[str] = build.ref
        self.digest: pulumi.Output[str] = build.digest
        self.job_id: pulumi.Output[str] = build.jobId
        self.register_outputs({"ref": self.ref, "digest": self.digest})
