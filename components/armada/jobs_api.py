"""A minimal client of the Armada server's job REST API: submit, status, errors, job-set events.

Routes and bodies follow armada v0.22.7 `pkg/api/api.swagger.json`: `POST /v1/job/submit`
(`apiJobSubmitRequest` -> `apiJobSubmitResponse`), `POST /v1/job/status` and `/v1/job/errors`
(`{jobIds}` -> `{jobStates}` / `{jobErrors}`), `POST /v1/job-set/{queue}/{id}` (`apiJobSetRequest`,
a stream). What the server really sends, read in armadaproject/armada v0.22.7 and
grpc-ecosystem/grpc-gateway v1.16.0 (the gateway version in Armada's go.mod):

- The gateway marshals with `runtime.JSONBuiltin` (internal/common/grpc/gateway.go
  CreateGatewayHandler), i.e. Go's encoding/json over the generated structs, not protojson: job
  states come back as enum *numbers* (`api.JobState` has an UnmarshalJSON accepting both, but no
  MarshalJSON: pkg/api/deserialize.go), though the swagger says strings. Both are accepted here.
- Status and errors are answered from the lookout database (internal/server/queryapi/query_api.go
  GetJobStatus, GetJobErrors): a job the lookout ingester has not recorded yet is `UNKNOWN`, and a
  failed job's error is the job's or its latest run's error text (query.sql.go GetJobErrorsByJobIds).
- A stream is newline-delimited JSON, one `{"result": <EventStreamMessage>}` per event and a final
  `{"error": {...}}` on failure (runtime/handler.go ForwardResponseStream, JSONBuiltin Delimiter
  "\\n"); an event message is `{"<kind>": {...}}` (pkg/api/event_util.go EventMessage.MarshalJSON).
  Without `watch` the server sends the job set's events so far and ends the stream.
- Submissions are validated as a whole (400 InvalidArgument) and answered per item with a jobId
  or an error (internal/server/submit/submit.go SubmitJobs).

Shares the retry, timeout, size-cap and credential rules of components/armada/queue_api.py
(`RestClient`). Standard library only: it runs inside Pulumi's dynamic-provider process.
"""
from __future__ import annotations

import email.utils
import json
import re
import urllib.parse
from typing import Optional, Union

from components.armada.queue_api import ArmadaApiError, RestClient, _read

JOB_STATES = (
    "QUEUED", "PENDING", "RUNNING", "SUCCEEDED", "FAILED", "UNKNOWN", "SUBMITTED", "LEASED", "PREEMPTED",
    "CANCELLED", "REJECTED",
)
"""`api.JobState` by number (pkg/api/submit.proto enum JobState)."""
SUCCEEDED = "SUCCEEDED"
FAILED_STATES = ("FAILED", "CANCELLED", "REJECTED", "PREEMPTED")
"""Terminal states other than success (a preempted job is not retried by itself)."""
MAX_STREAM_BYTES = 16 << 20
"""Job-set events read at most per call: a job set collects every job ever submitted to it."""
MAX_STREAM_LINE_BYTES = 1 << 20


class JobsApiError(ArmadaApiError):
    """A job request the Armada server rejected or could not answer."""

    api = "Armada job API"


def state_name(value: Union[str, int, None]) -> str:
    """A job state as the swagger spells it, from the gateway's number or name."""
    if isinstance(value, bool):
        return "UNKNOWN"
    if isinstance(value, int):
        return JOB_STATES[value] if 0 <= value < len(JOB_STATES) else "UNKNOWN"
    return value if value in JOB_STATES else "UNKNOWN"


class JobsClient(RestClient):
    """Armada jobs at `base_url` (e.g. `http://localhost:8080`); `headers` carries the
    Authorization (basic auth) of the user that submits."""

    error = JobsApiError
    url_hint = "the Armada REST URL of the build settings; see docs/builds.md"

    def submit(self, queue: str, job_set_id: str, items: list[dict]) -> list[str]:
        """POST /v1/job/submit; the job ids in item order. An item the server refused raises
        (sent once: a submission is not safe to repeat unless the connection was refused)."""
        return self.submit_timed(queue, job_set_id, items)[0]

    def submit_timed(self, queue: str, job_set_id: str, items: list[dict]) -> tuple[list[str], Optional[float]]:
        """`submit`, with the answer's `Date` header as seconds since the epoch (None without
        one): the server's clock, which also stamps new job ids (`job_id_time`)."""
        body = {"queue": queue, "jobSetId": job_set_id, "jobRequestItems": items}
        dated: dict = {}

        def read(response, deadline: float):
            dated["date"] = response.headers.get("Date")
            payload = _read(response, deadline)
            return json.loads(payload) if payload.strip() else {}

        answer = self._request("POST", "/v1/job/submit", body, resend=False, read=read)
        responses = answer.get("jobResponseItems") or [] if isinstance(answer, dict) else []
        url = self.base_url + "/v1/job/submit"
        if len(responses) != len(items):
            raise JobsApiError("POST", url, 200, f"expected {len(items)} job response items, got {len(responses)}")
        refused = [r.get("error") for r in responses if r.get("error") or not r.get("jobId")]
        if refused:
            raise JobsApiError("POST", url, 200, "; ".join(e or "no job id returned" for e in refused))
        try:
            server_time = email.utils.parsedate_to_datetime(dated["date"]).timestamp() if dated.get("date") else None
        except (TypeError, ValueError):
            server_time = None
        return [r["jobId"] for r in responses], server_time

    def status(self, job_ids: list[str]) -> dict[str, str]:
        """POST /v1/job/status: job id -> state name (`UNKNOWN` until lookout records the job)."""
        answer = self._request("POST", "/v1/job/status", {"jobIds": list(job_ids)})
        states = answer.get("jobStates") or {} if isinstance(answer, dict) else {}
        return {job_id: state_name(states.get(job_id)) for job_id in job_ids}

    def errors(self, job_ids: list[str]) -> dict[str, str]:
        """POST /v1/job/errors: job id -> its error text ("" when none is recorded)."""
        answer = self._request("POST", "/v1/job/errors", {"jobIds": list(job_ids)})
        errors = answer.get("jobErrors") or {} if isinstance(answer, dict) else {}
        return {job_id: str(errors.get(job_id) or "") for job_id in job_ids}

    def cancel(self, queue: str, job_set_id: str, job_id: str, reason: str) -> None:
        """POST /v1/job/cancel (`apiJobCancelRequest`)."""
        body = {"queue": queue, "jobSetId": job_set_id, "jobIds": [job_id], "reason": reason}
        self._request("POST", "/v1/job/cancel", body)

    def job_set_events(self, queue: str, job_set_id: str, from_message_id: str = "") -> list[dict]:
        """POST /v1/job-set/{queue}/{id} without watch: the `EventStreamMessage`s so far
        (`{"id": ..., "message": {"<kind>": {...}}}`), at most MAX_STREAM_BYTES of them."""
        path = "/v1/job-set/{}/{}".format(urllib.parse.quote(queue, safe=""), urllib.parse.quote(job_set_id, safe=""))
        body = {"id": job_set_id, "queue": queue, "watch": False, "errorIfMissing": False}
        if from_message_id:
            body["fromMessageId"] = from_message_id
        url = self.base_url + path

        def read(response, _deadline: float) -> list[dict]:
            # Every read of the response, a line's included, ends by the call's deadline
            # (components/transport.py): a line dripped without its newline cannot hold the call.
            events, total = [], 0
            while True:
                line = response.readline(MAX_STREAM_LINE_BYTES + 1)
                if not line:
                    return events
                total += len(line)
                if len(line) > MAX_STREAM_LINE_BYTES or total > MAX_STREAM_BYTES:
                    return events  # enough: the caller looks for one job's events
                if not line.strip():
                    continue
                chunk = json.loads(line)
                if isinstance(chunk, dict) and chunk.get("error"):
                    error = chunk["error"]
                    message = error.get("message") if isinstance(error, dict) else str(error)
                    raise JobsApiError("POST", url, 200, f"the event stream ended with an error: {message}")
                if isinstance(chunk, dict) and isinstance(chunk.get("result"), dict):
                    events.append(chunk["result"])

        return self._request("POST", path, body, read=read)


class BinocularsClient(RestClient):
    """Binoculars' REST API (pkg/api/binoculars/binoculars.proto `Logs`: POST /v1/binoculars/log)."""

    error = JobsApiError
    url_hint = "the binoculars URL of the build settings; see docs/builds.md"

    def logs(self, job_id: str, namespace: str, tail_lines: int = 200) -> list[str]:
        """The last `tail_lines` log lines of the job's first pod."""
        body = {"jobId": job_id, "podNumber": 0, "podNamespace": namespace, "logOptions": {"tailLines": tail_lines}}
        answer = self._request("POST", "/v1/binoculars/log", body)
        lines = answer.get("log") or [] if isinstance(answer, dict) else []
        return [str(line.get("line", "")) for line in lines if isinstance(line, dict)]


_CROCKFORD = "0123456789abcdefghjkmnpqrstvwxyz"


def job_id_time(job_id: str) -> Optional[float]:
    """When the server created a job, from its id: Armada v0.22.7 job ids are lower-case ULIDs
    (internal/common/util/uuid.go NewULID, the submit server's idGenerator), whose first 10
    Crockford base-32 characters are the creation time in milliseconds. None for another form."""
    if not isinstance(job_id, str) or len(job_id) != 26 or any(c not in _CROCKFORD for c in job_id.lower()):
        return None
    milliseconds = 0
    for char in job_id.lower()[:10]:
        milliseconds = milliseconds * 32 + _CROCKFORD.index(char)
    return milliseconds / 1000


_POOL = re.compile(r"^pool (\S+):$", re.MULTILINE)
_NO_NODES = re.compile(r"^Number of nodes in cluster:\s*0\s*$", re.MULTILINE)


def rejected_for_no_nodes(reason: str) -> bool:
    """Whether a REJECTED job's error says only that no node of any pool was known: the scheduler's
    submit check writes, per pool, "pool <name>:" and the pod scheduling context, whose
    "Number of nodes in cluster: N" is 0 for a pool no executor has reported yet (v0.22.7
    internal/scheduler/submitcheck.go getSchedulingResult, scheduling/context/pod.go
    PodSchedulingContext.String). A rejection naming any pool with nodes (the job fits none of
    them), or another reason (invalid resources, a queue limit, a gang), is not this."""
    blocks = _POOL.split(reason)[1:]  # name, body, name, body, ...
    return bool(blocks) and all(_NO_NODES.search(body) for body in blocks[1::2])


def failure_reason(events: list[dict], job_id: str) -> Optional[str]:
    """The `reason` of the job's last `failed` event among job-set events, if any."""
    reason = None
    for event in events:
        failed = ((event.get("message") or {}).get("failed") or {}) if isinstance(event, dict) else {}
        if failed.get("jobId") == job_id and failed.get("reason"):
            reason = failed["reason"]
    return reason
