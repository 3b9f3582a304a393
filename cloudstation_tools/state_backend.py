"""Read a deployed stack's outputs, with the Pulumi CLI or straight from a DIY state backend.

With `pulumi` on PATH this asks the CLI (`pulumi stack output <name> --json --stack <stack>`). Without it (CI with only
backend and registry access) it reads the checkpoint the CLI wrote:

    <backend>/.pulumi/stacks/<project>/<stack>.json[.gz]     (version 3 checkpoint)

and takes the outputs of the `pulumi:pulumi:Stack` resource in `checkpoint.latest.resources`.
Backends: `file://<dir>` and `s3://<bucket>[/<prefix>][?endpoint=host:port&s3ForcePathStyle=true
&disableSSL=true&region=…&profile=…]`. The backend is `--backend`, else PULUMI_BACKEND_URL, else
`backend.url` in Pulumi.yaml.

Reads are bounded (components/limits.py): the CLI and S3 get what is left of the run's deadline, and a
checkpoint larger than MAX_CHECKPOINT_BYTES is refused rather than read.
"""
from __future__ import annotations

import zlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Mapping, Optional
from urllib.parse import parse_qs, urlsplit

import yaml

from infra.config import PROJECT
from components.limits import MAX_CHECKPOINT_BYTES, Deadline, DeadlineExceeded

STACK_TYPE = "pulumi:pulumi:Stack"
SECRET_SIGNATURE = "4dabf18193072939515e22adb298388d"
"""Pulumi's marker key for a secret value in serialized state."""


class StateError(Exception):
    """The outputs could not be read; str() says where and why."""


def backend_url(explicit: Optional[str], root: Path, env: Mapping[str, str] = os.environ) -> Optional[str]:
    if explicit:
        return explicit
    if env.get("PULUMI_BACKEND_URL"):
        return env["PULUMI_BACKEND_URL"]
    project_file = root / "Pulumi.yaml"
    if project_file.is_file():
        try:
            backend = (yaml.safe_load(project_file.read_text()) or {}).get("backend") or {}
        except yaml.YAMLError:
            return None  # the CLI reports a broken Pulumi.yaml; here it only means "no backend set there"
        return backend.get("url")
    return None


def stack_output(
    stack: str, name: str, *, backend: Optional[str] = None, root: Path, project: str = PROJECT,
    use_cli: Optional[bool] = None, deadline: Optional[Deadline] = None,
) -> Any:
    """One output of `stack`'s latest deployment (a secret output is returned opaque, never decrypted)."""
    deadline = deadline or Deadline(None)
    try:
        return _stack_output(stack, name, backend, root, project, use_cli, deadline)
    except DeadlineExceeded as error:
        raise StateError(str(error)) from None


def _stack_output(
    stack: str, name: str, backend: Optional[str], root: Path, project: str, use_cli: Optional[bool],
    deadline: Deadline,
) -> Any:
    url = backend_url(backend, root)
    if use_cli is None:
        use_cli = shutil.which("pulumi") is not None
    if use_cli:
        return _from_cli(stack, name, url, root, deadline)
    if not url:
        raise StateError(
            "no state backend to read the stack outputs from: pass --backend file://<dir> or "
            "s3://<bucket>?…, or set PULUMI_BACKEND_URL"
        )
    where = f"{url.split('?')[0]} stack {stack}"
    outputs = outputs_from_checkpoint(read_checkpoint(url, project, stack, deadline), where)
    if name not in outputs:
        raise StateError(f"{where} has no output `{name}` (outputs: {', '.join(sorted(outputs)) or 'none'})")
    return outputs[name]


def _from_cli(stack: str, name: str, url: Optional[str], root: Path, deadline: Deadline) -> Any:
    env = dict(os.environ, **({"PULUMI_BACKEND_URL": url} if url else {}))
    what = f"`pulumi stack output {name} --stack {stack}`"
    try:
        result = subprocess.run(
            ["pulumi", "stack", "output", name, "--json", "--stack", stack],
            cwd=root, env=env, capture_output=True, text=True, timeout=deadline.timeout(3600, what),
        )
    except subprocess.TimeoutExpired:
        raise DeadlineExceeded(f"{what}: gave up at the {deadline.seconds:g} s deadline (--timeout)") from None
    if result.returncode != 0:
        raise StateError(f"`pulumi stack output {name} --stack {stack}` failed: {result.stderr.strip()[:500]}")
    return json.loads(result.stdout)


def read_checkpoint(url: str, project: str, stack: str, deadline: Optional[Deadline] = None) -> dict:
    """The parsed checkpoint file of `project/stack` in the backend at `url`."""
    parts = urlsplit(url)
    names = [f".pulumi/stacks/{project}/{stack}.json", f".pulumi/stacks/{project}/{stack}.json.gz"]
    if parts.scheme == "file":
        base = Path(parts.netloc + parts.path) if parts.netloc not in ("", "localhost") else Path(parts.path)
        for name in names:
            if (base / name).is_file():
                if (base / name).stat().st_size > MAX_CHECKPOINT_BYTES:
                    raise StateError(f"{base / name} is larger than the {MAX_CHECKPOINT_BYTES} bytes allowed")
                return _parse((base / name).read_bytes(), name, url)
        raise StateError(f"stack {project}/{stack} not found in {url} (looked for {base / names[0]})")
    if parts.scheme == "s3":
        return _read_s3(parts, names, url, project, stack, deadline or Deadline(None))
    raise StateError(f"unsupported backend {url!r}: use file://<dir> or s3://<bucket>")


def _read_s3(parts, names: list[str], url: str, project: str, stack: str, deadline: Deadline) -> dict:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    endpoint = query.get("endpoint")
    if endpoint and "://" not in endpoint:
        endpoint = f"{'http' if query.get('disableSSL') == 'true' else 'https'}://{endpoint}"
    session = boto3.Session(profile_name=query.get("profile"), region_name=query.get("region"))
    style = "path" if query.get("s3ForcePathStyle") == "true" else "auto"
    wait = deadline.timeout(30, f"s3://{parts.netloc}")
    limits = Config(s3={"addressing_style": style}, connect_timeout=wait, read_timeout=wait, retries={"max_attempts": 3})
    client = session.client("s3", endpoint_url=endpoint, config=limits)
    prefix = parts.path.strip("/")
    for name in names:
        key = f"{prefix}/{name}" if prefix else name
        try:
            deadline.check(f"s3://{parts.netloc}/{key}")
            answer = client.get_object(Bucket=parts.netloc, Key=key)
            if answer.get("ContentLength", 0) > MAX_CHECKPOINT_BYTES:
                raise StateError(f"s3://{parts.netloc}/{key} is larger than the {MAX_CHECKPOINT_BYTES} bytes allowed")
            body = answer["Body"].read(MAX_CHECKPOINT_BYTES + 1)
            if len(body) > MAX_CHECKPOINT_BYTES:
                raise StateError(f"s3://{parts.netloc}/{key} is larger than the {MAX_CHECKPOINT_BYTES} bytes allowed")
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                continue
            code = error.response.get("Error", {}).get("Code")
            raise StateError(f"cannot read s3://{parts.netloc}/{key}: {code}") from None
        except BotoCoreError as error:
            raise StateError(f"cannot read s3://{parts.netloc}/{key}: {error}") from None
        return _parse(body, name, url)
    raise StateError(f"stack {project}/{stack} not found in {url.split('?')[0]} (looked for {names[0]})")


def _parse(data: bytes, name: str, url: str) -> dict:
    if name.endswith(".gz"):
        inflate = zlib.decompressobj(wbits=31)  # gzip, bounded: a small .gz may expand without limit
        try:
            data = inflate.decompress(data, MAX_CHECKPOINT_BYTES + 1)
        except zlib.error as error:
            raise StateError(f"{name} in {url.split('?')[0]} is not gzip: {error}") from None
        if len(data) > MAX_CHECKPOINT_BYTES or inflate.unconsumed_tail:
            raise StateError(f"{name} in {url.split('?')[0]} expands to more than {MAX_CHECKPOINT_BYTES} bytes")
    try:
        checkpoint = json.loads(data)
    except ValueError as error:
        raise StateError(f"{name} in {url.split('?')[0]} is not a checkpoint: {error}") from None
    if not isinstance(checkpoint, dict):
        raise StateError(f"{name} in {url.split('?')[0]} is not a checkpoint (not a JSON object)")
    return checkpoint


def outputs_from_checkpoint(checkpoint: dict, where: str) -> dict[str, Any]:
    """The stack resource's outputs in a version 3 checkpoint."""
    if checkpoint.get("version") != 3:
        raise StateError(f"{where}: checkpoint version {checkpoint.get('version')!r} is not supported (expected 3)")
    latest = (checkpoint.get("checkpoint") or {}).get("latest") or {}
    for resource in latest.get("resources") or []:
        if resource.get("type") == STACK_TYPE:
            return {k: _plain(v, f"{where}: output {k!r}") for k, v in (resource.get("outputs") or {}).items()}
    raise StateError(f"{where}: the stack has not been deployed (no {STACK_TYPE} resource in its checkpoint)")


def _plain(value: Any, where: str) -> Any:
    if isinstance(value, dict):
        if SECRET_SIGNATURE in value:
            return _Secret(where)
        return {k: _plain(v, where) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, where) for v in value]
    return value


class _Secret:
    """An encrypted output: promotion never needs one, so it is kept opaque instead of decrypted."""

    def __init__(self, where: str):
        self.where = where

    def __repr__(self) -> str:
        return "[secret]"
