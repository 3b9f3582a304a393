"""Scheduled logical backups of a managed PostgreSQL store, and its restore (docs/backups.md).

One `PostgresBackup` per managed server, built by whoever builds the server (CloudStateStore for
the projects' and project-state's stores, infra/armada.py for Armada's):

- CronJob `<store>-backup`: `pg_dump --format=custom` of each of the server's databases, packed
  with their SHA-256 sums into one file `<store>-<UTC stamp>.tar`, then kept on a
  PersistentVolumeClaim `<store>-backups` (kept when the stack drops it) or uploaded to S3 under
  `<prefix>/<namespace>/<store>/`; only the newest `retention` backups are kept.
- CronJob `<store>-restore`: suspended and never scheduled; `kubectl create job --from=cronjob/…`
  restores the newest backup (or the one a ConfigMap names) into fresh databases and swaps them in.
- NetworkPolicy `<store>-backup`: both pods reach the server (and the S3 endpoint), nothing else.

The scripts are built by pure functions (`dump_script`, `prune_script`, `restore_script`,
`S3_CLIENT`), so the tests run the very text the CronJobs run against a real PostgreSQL and an S3
server (tests/test_backups.py).
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s
from pydantic import AfterValidator, Field, model_validator

from components import k8s as kb
from components import network
from components.component import Component
from components.model import ConfigModel, check_mode_keys, problem
from components.postgres import UID, Postgres, SecretRef
from infra import versions

BACKUP_COMPONENT = "database-backup"
RESTORE_COMPONENT = "database-restore"
BACKUP_DIR = "/backups"
"""Where the PVC target is mounted (restore mounts it read-only)."""
WORK_DIR = "/work"
"""The emptyDir of the S3 target: the dump waits here for its upload (or a download for its restore)."""
S3_KEYS = ("accessKeyId", "secretAccessKey")
"""Keys of the S3 credentials Secret named in config."""
RESTORE_CONFIG_MAP = "{store}-restore"
"""An optional ConfigMap (created by hand, never by Pulumi) whose key `backup` names the backup to restore."""
NEVER = "0 0 30 2 *"
"""The restore CronJob's schedule: 30 February never comes (and the CronJob is suspended as well)."""
CRONJOB_NAME_MAX = 52
"""Kubernetes limits CronJob names to 52 characters (its Jobs append an 11-character suffix)."""
DEFAULT_RESOURCES = kb.Resources(cpu_request="25m", memory_request="64Mi", cpu_limit="500m", memory_limit="256Mi")
"""pg_dump and the uploader stream; small requests keep the example stacks within their budget."""


# --- config ------------------------------------------------------------------------------------

_MACROS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
_FIELDS = (("minute", 0, 59, ()), ("hour", 0, 23, ()), ("day of month", 1, 31, ()),
           ("month", 1, 12, ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")),
           ("day of week", 0, 7, ("sun", "mon", "tue", "wed", "thu", "fri", "sat")))


def _cron_value(token: str, low: int, high: int, names: Sequence[str]) -> Optional[int]:
    if token.isdigit():
        return int(token) if low <= int(token) <= high else None
    if token.lower() in names:
        return names.index(token.lower()) + (1 if low == 1 else 0)
    return None


def _cron_field(text: str, low: int, high: int, names: Sequence[str]) -> bool:
    """One field as Kubernetes' parser (robfig/cron ParseStandard) reads it: `*`, `?`, values,
    ranges and steps, comma-separated."""
    for part in text.split(","):
        base, slash, step = part.partition("/")
        if slash and not (step.isdigit() and int(step) >= 1):
            return False
        if base in ("*", "?"):
            continue
        start, dash, end = base.partition("-")
        first = _cron_value(start, low, high, names)
        last = _cron_value(end, low, high, names) if dash else first
        if first is None or last is None or last < first:
            return False
    return True


def check_schedule(value: str) -> str:
    """A CronJob schedule: five fields in range, or a macro such as @daily. Time zones (`TZ=`,
    `CRON_TZ=`) are refused: the API server rejects them in `schedule` (use UTC)."""
    fields = value.split()
    if len(fields) == 1 and fields[0] in _MACROS:
        return value
    if len(fields) == 5 and all(_cron_field(f, low, high, names) for f, (_, low, high, names) in zip(fields, _FIELDS)):
        return value
    raise problem("must be a cron schedule in UTC: five fields (minute hour day-of-month month day-of-week, "
                  f"e.g. '30 2 * * *') or one of {', '.join(_MACROS)}")


Schedule = Annotated[str, AfterValidator(check_schedule)]

_ENDPOINT = re.compile(r"^(?P<scheme>https?)://(?P<host>[A-Za-z0-9]([-.A-Za-z0-9]*[A-Za-z0-9])?)(:(?P<port>[0-9]{1,5}))?/?$")


class S3Target(ConfigModel):
    """An S3 bucket (AWS S3 or any S3-compatible server) the backups are uploaded to."""

    endpoint: str
    """`https://host[:port]`, e.g. `https://s3.eu-west-1.amazonaws.com`; `http://` only for a
    Service in the cluster (`http://minio.backup.svc:9000`)."""
    bucket: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
    """The bucket (it must exist; the backups never create it)."""
    prefix: str = Field(default="cloudstation", pattern=r"^([A-Za-z0-9_-][A-Za-z0-9._-]*(/[A-Za-z0-9_-][A-Za-z0-9._-]*)*)?$")
    """Key prefix; each store's backups go under `<prefix>/<namespace>/<store>/`."""
    region: str = Field(default="us-east-1", pattern=r"^[a-z0-9][a-z0-9-]{0,31}$")
    """The region requests are signed for (AWS Signature Version 4)."""
    addressing: Literal["path", "virtual"] = "path"
    """`path`: `<endpoint>/<bucket>/<key>` (every S3-compatible server); `virtual`: `<bucket>.<endpoint host>/<key>`."""
    credentials_secret: SecretRef
    """An existing Secret with keys `accessKeyId` and `secretAccessKey`; copied into each store's
    namespace (credentials never appear in config)."""
    cidrs: network.Cidrs = []
    """The endpoint's addresses as CIDRs, the only ones the backup pods' NetworkPolicy allows;
    required unless the endpoint is a Service in the cluster (`<service>.<namespace>.svc`)."""
    allow_any_address: bool = False
    """Opt in to letting the backup pods connect to ANY address on the endpoint's port."""

    @model_validator(mode="after")
    def _endpoint(self) -> "S3Target":
        match = _ENDPOINT.match(self.endpoint)
        if not match or (match["port"] and not 1 <= int(match["port"]) <= 65535):
            raise problem("must be the S3 endpoint's URL without path or credentials: https://host[:port]",
                          ".endpoint", self.endpoint)
        if match["scheme"] == "http" and not network.SERVICE_HOST.match(match["host"]):
            raise problem("must be https:// outside the cluster (backups hold the stores' data); http:// only "
                          "for a Service in the cluster (<service>.<namespace>.svc)", ".endpoint", self.endpoint)
        network.check_server_addresses([match["host"]], self.cidrs, self.allow_any_address)
        return self

    @property
    def host(self) -> str:
        return _ENDPOINT.match(self.endpoint)["host"]

    @property
    def port(self) -> int:
        match = _ENDPOINT.match(self.endpoint)
        return int(match["port"] or (443 if match["scheme"] == "https" else 80))

    def endpoint_peer(self) -> network.Endpoint:
        """What the backup pods' egress allows: the endpoint's Service namespace, or its CIDRs."""
        hosts = self.host if self.addressing == "path" else f"{self.bucket}.{self.host}"
        return network.host_endpoint(hosts, self.port, self.cidrs, self.allow_any_address)


class BackupSettings(ConfigModel):
    """Scheduled logical backups of every managed PostgreSQL store of the stack (the projects',
    project-state's and Armada's), on by default (docs/backups.md)."""

    enabled: bool = True
    """false: no backup objects at all (existing backup claims are kept)."""
    schedule: Schedule = "30 2 * * *"
    """When each backup starts (cron, UTC)."""
    retention: int = Field(default=7, ge=1, le=1000)
    """How many of the newest backups of each store are kept; older ones are deleted after each backup."""
    target: Literal["pvc", "s3"] = "pvc"
    """`pvc`: a PersistentVolumeClaim `<store>-backups` beside the store (kept when the stack drops
    it); `s3`: a bucket (`s3`)."""
    storage: kb.Storage = kb.Storage(size="5Gi")
    """pvc: the claim's size and class; it holds `retention` backups and one more while it is written."""
    s3: Optional[S3Target] = None
    """s3: the bucket, its endpoint and the Secret with its credentials."""
    resources: kb.Resources = DEFAULT_RESOURCES
    """Requests and limits of each backup and restore container."""
    deadline_seconds: int = Field(default=3600, ge=60, le=86400)
    """A backup or restore still running after this long is stopped and counts as failed."""

    @model_validator(mode="after")
    def _target_keys(self) -> "BackupSettings":
        check_mode_keys(
            self, self.target, only={"pvc": ("storage",), "s3": ("s3",)},
            required={"s3": {"s3": "{endpoint, bucket, region, credentialsSecret: {namespace, name}, cidrs}"}},
        )
        return self


# --- pure builders ---------------------------------------------------------------------------


def object_name(store: str, suffix: str, limit: int = CRONJOB_NAME_MAX) -> str:
    """`<store>-<suffix>`, shortened with a hash of the store's name when longer than `limit`."""
    name = f"{store}-{suffix}"
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(store.encode()).hexdigest()[:8]
    return f"{store[: limit - len(suffix) - len(digest) - 2].rstrip('-')}-{digest}-{suffix}"


def file_pattern(store: str) -> str:
    """The names of a store's backups as an extended regular expression (grep -E and Python).
    Store names are DNS labels: nothing in them needs escaping."""
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", store):
        raise ValueError(f"not a store name: {store!r}")
    return store + "-[0-9]{8}T[0-9]{6}Z\\.tar"


def s3_key_value(data: Optional[dict], key: str, ref: SecretRef) -> str:
    """One (base64) value of the S3 credentials Secret, or a clear error naming the Secret and key."""
    if not data or key not in data:
        raise ValueError(f"Secret {ref.namespace}/{ref.name} has no key '{key}' "
                         f"(platform.stores.backups.s3.credentialsSecret needs {' and '.join(S3_KEYS)})")
    return data[key]


def dump_script(store: str, databases: Sequence[str]) -> str:
    """sh: dump every database into one file `<store>-<stamp>.tar` in $BACKUP_DIR, written under
    a temporary name and renamed when complete (a failed run never leaves a file that looks like a
    backup). libpq takes the server and login from PGHOST, PGPORT, PGUSER and PGPASSWORD."""
    dumps = " ".join(f"{db}.dump" for db in databases)
    dump_each = "\n".join(
        f'pg_dump --no-password --format=custom --dbname={db} --file="$work/{db}.dump"' for db in databases
    )
    return (
        "set -eu\n"
        "umask 077\n"
        'cd "$BACKUP_DIR"\n'
        "stamp=$(date -u +%Y%m%dT%H%M%SZ)\n"
        f'name="{store}-$stamp.tar"\n'
        "# Leftovers of runs that failed over a day ago (a running backup's are younger).\n"
        "find . -maxdepth 1 -name '.partial-*' -mmin +1440 -exec rm -rf {} \\;\n"
        'work=$(mktemp -d "$BACKUP_DIR/.partial-$stamp-XXXXXX")\n'
        f"{dump_each}\n"
        f'(cd "$work" && sha256sum {dumps} > SHA256SUMS)\n'
        f'tar -cf "$work.tar" -C "$work" SHA256SUMS {dumps}\n'
        'rm -rf "$work"\n'
        'mv "$work.tar" "$name"\n'
        'echo "backup $name: $(wc -c < "$name") bytes"\n'
    )


def prune_script(store: str, retention: int) -> str:
    """sh: keep the newest `retention` backups in $BACKUP_DIR (and always the one just written,
    `$name`), delete the older ones. Names sort by their UTC stamp."""
    return (
        f"ls -1 | grep -E '^{file_pattern(store)}$' | sort -r | tail -n +{retention + 1} | while read -r old; do\n"
        '  if [ "$old" != "$name" ]; then rm -f -- "$old"; echo "deleted $old"; fi\n'
        "done\n"
    )


def restore_script(store: str, databases: Sequence[str]) -> str:
    """sh: restore `$BACKUP` (a file name in $BACKUP_DIR; unset or empty: the newest there).
    Checks the sums, restores every database into a new database `cloudstation_restore_<n>` and
    only when all succeeded replaces each database by its restored copy (DROP ... WITH (FORCE)
    ends the connections still open to it), so a failed restore leaves the live data untouched."""
    pattern = file_pattern(store)
    lines = [
        "set -eu",
        'cd "$BACKUP_DIR"',
        'file="${BACKUP:-}"',
        f"if [ -z \"$file\" ]; then file=$(ls -1 | grep -E '^{pattern}$' | sort | tail -n 1 || true); fi",
        f"if ! printf '%s\\n' \"$file\" | grep -qxE '{pattern}' || [ ! -f \"$file\" ]; then",
        f'  echo "no backup to restore: \'$file\' is not a backup of {store} in $BACKUP_DIR" >&2; exit 1',
        "fi",
        'echo "restoring $file"',
        "work=$(mktemp -d /tmp/restore-XXXXXX)",
        'tar -xf "$BACKUP_DIR/$file" -C "$work"',
        'cd "$work"',
        "sha256sum -c SHA256SUMS",
    ]
    for index, db in enumerate(databases, start=1):
        scratch = f"cloudstation_restore_{index}"
        lines += [
            f"psql --no-password -v ON_ERROR_STOP=1 --dbname=postgres -c 'DROP DATABASE IF EXISTS {scratch}' "
            f"-c 'CREATE DATABASE {scratch}'",
            f"pg_restore --no-password --no-owner --exit-on-error --single-transaction --dbname={scratch} {db}.dump",
        ]
    for index, db in enumerate(databases, start=1):
        lines.append(
            f"psql --no-password -v ON_ERROR_STOP=1 --dbname=postgres -c 'DROP DATABASE IF EXISTS {db} WITH (FORCE)' "
            f"-c 'ALTER DATABASE cloudstation_restore_{index} RENAME TO {db}'"
        )
    lines.append(f'echo "restored {", ".join(databases)} from $file"')
    return "\n".join(lines) + "\n"


S3_CLIENT = r'''
"""Upload, list, prune and download backups on S3 (Signature Version 4, standard library only)."""
import datetime, hashlib, hmac, http.client, os, re, ssl, sys, time, urllib.parse
import xml.etree.ElementTree as ET

env = os.environ
url = urllib.parse.urlsplit(env["S3_ENDPOINT"])
bucket, prefix, region = env["S3_BUCKET"], env["S3_PREFIX"], env["S3_REGION"]
path_style = env.get("S3_ADDRESSING", "path") == "path"
host = url.hostname if path_style else bucket + "." + url.hostname
netloc = host + (":" + str(url.port) if url.port else "")
directory, store = env["BACKUP_DIR"], env["BACKUP_NAME"]
pattern = re.compile(re.escape(store) + r"-[0-9]{8}T[0-9]{6}Z\.tar")
part_size = int(env.get("S3_PART_SIZE", str(16 * 1024 * 1024)))
access_key = env["AWS_ACCESS_KEY_ID"]
signing_key = env["AWS_SECRET_ACCESS_KEY"]


def quote(text):
    return urllib.parse.quote(text, safe="-_.~")


def sign(key, message):
    return hmac.new(key, message.encode(), hashlib.sha256).digest()


def headers_for(method, path, query, payload_hash):
    now = datetime.datetime.now(datetime.timezone.utc)
    stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    headers = {"host": netloc, "x-amz-content-sha256": payload_hash, "x-amz-date": stamp}
    names = sorted(headers)
    canonical = "\n".join([
        method, path, "&".join(quote(k) + "=" + quote(v) for k, v in sorted(query.items())),
        "".join(n + ":" + headers[n] + "\n" for n in names), ";".join(names), payload_hash])
    scope = day + "/" + region + "/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = sign(sign(sign(sign(("AWS4" + signing_key).encode(), day), region), "s3"), "aws4_request")
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = ("AWS4-HMAC-SHA256 Credential=" + access_key + "/" + scope +
                                ", SignedHeaders=" + ";".join(names) + ", Signature=" + signature)
    return headers


def request(method, key=None, query=None, body=b"", sink=None, payload_hash=None, size=None):
    """One signed request, retried on connection errors and 5xx; body is bytes or a path to send.
    Returns (status, headers, body bytes) of a 2xx answer, else raises."""
    query = query or {}
    path = (url.path.rstrip("/") + ("/" + bucket if path_style else "") +
            ("/" + "/".join(quote(p) for p in key.split("/")) if key is not None else ("" if path_style else "/")))
    target = path + ("?" + "&".join(quote(k) + "=" + quote(v) for k, v in sorted(query.items())) if query else "")
    if payload_hash is None:
        payload_hash = hashlib.sha256(body).hexdigest()
    for attempt in range(4):
        connection = (http.client.HTTPSConnection(host, url.port, timeout=300, context=ssl.create_default_context())
                      if url.scheme == "https" else http.client.HTTPConnection(host, url.port, timeout=300))
        try:
            headers = headers_for(method, path, query, payload_hash)
            if isinstance(body, str):
                headers["content-length"] = str(size)
                with open(body, "rb") as data:
                    connection.request(method, target, body=data, headers=headers)
                    response = connection.getresponse()
            else:
                headers["content-length"] = str(len(body))
                connection.request(method, target, body=body, headers=headers)
                response = connection.getresponse()
            if 200 <= response.status < 300 and sink is not None:
                with open(sink, "wb") as out:
                    while True:
                        chunk = response.read(1024 * 1024)
                        if not chunk:
                            break
                        out.write(chunk)
                return response.status, dict(response.getheaders()), b""
            answer = response.read()
            if 200 <= response.status < 300:
                return response.status, dict(response.getheaders()), answer
            if response.status < 500 or attempt == 3:
                raise SystemExit(method + " " + target + ": HTTP " + str(response.status) + " " + answer[:500].decode(errors="replace"))
        except OSError as error:
            if attempt == 3:
                raise SystemExit(method + " " + target + ": " + str(error))
        finally:
            connection.close()
        time.sleep(2 ** attempt)


def elements(xml, name):
    return [e for e in ET.fromstring(xml).iter() if e.tag.rsplit("}", 1)[-1] == name]


def text(xml, name):
    found = elements(xml, name)
    return found[0].text if found else None


def backups():
    """The keys of this store's backups under the prefix, oldest first."""
    keys, token = [], None
    while True:
        query = {"list-type": "2", "max-keys": env.get("S3_LIST_PAGE", "1000"), "prefix": prefix}
        if token:
            query["continuation-token"] = token
        _, _, answer = request("GET", query=query)
        keys += [e.text for e in elements(answer, "Key")]
        token = text(answer, "NextContinuationToken")
        if text(answer, "IsTruncated") != "true" or not token:
            break
    return sorted(k for k in keys if k.startswith(prefix) and pattern.fullmatch(k[len(prefix):]))


def file_hash(path, start=0, length=None):
    digest = hashlib.sha256()
    with open(path, "rb") as data:
        data.seek(start)
        remaining = os.path.getsize(path) - start if length is None else length
        while remaining > 0:
            chunk = data.read(min(remaining, 1024 * 1024))
            if not chunk:
                break
            digest.update(chunk)
            remaining -= len(chunk)
    return digest.hexdigest()


def upload(path, key):
    size = os.path.getsize(path)
    if size <= part_size:
        request("PUT", key, body=path, payload_hash=file_hash(path), size=size)
    else:
        _, _, answer = request("POST", key, query={"uploads": ""})
        upload_id = text(answer, "UploadId")
        try:
            parts = []
            with open(path, "rb") as data:
                number = 1
                while True:
                    chunk = data.read(part_size)
                    if not chunk:
                        break
                    _, headers, _ = request("PUT", key, query={"partNumber": str(number), "uploadId": upload_id}, body=chunk)
                    etag = {k.lower(): v for k, v in headers.items()}["etag"]
                    parts.append("<Part><PartNumber>%d</PartNumber><ETag>%s</ETag></Part>" % (number, etag))
                    number += 1
            document = ("<CompleteMultipartUpload>" + "".join(parts) + "</CompleteMultipartUpload>").encode()
            _, _, answer = request("POST", key, query={"uploadId": upload_id}, body=document)
            if elements(answer, "Error"):
                raise SystemExit("completing the upload of " + key + " failed: " + answer[:500].decode(errors="replace"))
        except BaseException:
            request("DELETE", key, query={"uploadId": upload_id})
            raise
    _, headers, _ = request("HEAD", key)
    stored = int({k.lower(): v for k, v in headers.items()}["content-length"])
    if stored != size:
        raise SystemExit(key + ": stored " + str(stored) + " bytes, uploaded " + str(size))


def main(command):
    if command == "upload":
        [name] = [n for n in os.listdir(directory) if pattern.fullmatch(n)]
        upload(os.path.join(directory, name), prefix + name)
        print("uploaded s3://" + bucket + "/" + prefix + name)
        retention = int(env["RETENTION"])
        for key in backups()[:-retention]:
            if key != prefix + name:
                request("DELETE", key)
                print("deleted s3://" + bucket + "/" + key)
    elif command == "download":
        wanted = env.get("BACKUP", "")
        if wanted and not pattern.fullmatch(wanted):
            raise SystemExit("BACKUP=" + wanted + " is not a backup name of " + store)
        found = backups()
        if not found:
            raise SystemExit("no backup of " + store + " under s3://" + bucket + "/" + prefix)
        key = prefix + wanted if wanted else found[-1]
        name = key[len(prefix):]
        request("GET", key, sink=os.path.join(directory, ".partial-" + name))
        os.rename(os.path.join(directory, ".partial-" + name), os.path.join(directory, name))
        print("downloaded s3://" + bucket + "/" + key)
    elif command == "list":
        for key in backups():
            print(key[len(prefix):])
    else:
        raise SystemExit("usage: upload | download | list")


main(sys.argv[1] if len(sys.argv) > 1 else "")
'''
"""Python 3 (standard library only) run by `python3 -c` in the pinned `python` image: `upload`
(the one backup in $BACKUP_DIR, then delete all but the newest $RETENTION), `download` ($BACKUP or
the newest, into $BACKUP_DIR) and `list`. Requests are signed with AWS Signature Version 4 from
$AWS_ACCESS_KEY_ID/$AWS_SECRET_ACCESS_KEY; files over $S3_PART_SIZE (16 MiB) go up in parts, and
listings come $S3_LIST_PAGE (1000) keys a page. The secret key never leaves the pod: only signatures
are sent."""


def s3_prefix(settings: S3Target, namespace: str, store: str) -> str:
    """`<prefix>/<namespace>/<store>/`: stores and stacks can share one bucket."""
    return "/".join(p for p in (settings.prefix, namespace, store) if p) + "/"


def s3_env(settings: S3Target, namespace: str, store: str, secret: str) -> list[dict]:
    return [
        {"name": "S3_ENDPOINT", "value": settings.endpoint},
        {"name": "S3_BUCKET", "value": settings.bucket},
        {"name": "S3_PREFIX", "value": s3_prefix(settings, namespace, store)},
        {"name": "S3_REGION", "value": settings.region},
        {"name": "S3_ADDRESSING", "value": settings.addressing},
        kb.secret_env("AWS_ACCESS_KEY_ID", secret, "accessKeyId"),
        kb.secret_env("AWS_SECRET_ACCESS_KEY", secret, "secretAccessKey"),
    ]


@dataclass(frozen=True)
class BackupPlan:
    """Everything the pod specs need: one store, its databases and where its backups go."""

    store: str
    """The server's name (its Service, and the prefix of every backup object's name)."""
    namespace: str
    databases: tuple[str, ...]
    credentials_secret: str
    """The server's credentials Secret (keys username, password)."""
    settings: BackupSettings
    postgres_image: str
    s3_image: str
    s3_secret: Optional[str] = None
    """The copy of the S3 credentials in the store's namespace (s3 target)."""

    @property
    def backup_name(self) -> str:
        return object_name(self.store, "backup")

    @property
    def restore_name(self) -> str:
        return object_name(self.store, "restore")

    @property
    def claim_name(self) -> str:
        return object_name(self.store, "backups", 63)


def _postgres_env(plan: BackupPlan, directory: str) -> list[dict]:
    return [
        {"name": "PGHOST", "value": plan.store},
        {"name": "PGPORT", "value": "5432"},
        kb.secret_env("PGUSER", plan.credentials_secret, "username"),
        kb.secret_env("PGPASSWORD", plan.credentials_secret, "password"),
        {"name": "BACKUP_DIR", "value": directory},
    ]


def _container(name: str, image: str, argv: list[str], env: list[dict], mounts: list[dict], plan: BackupPlan) -> dict:
    return {
        "name": name,
        "image": image,
        "command": argv[:1],
        "args": argv[1:],
        "env": env,
        "resources": plan.settings.resources.spec(),
        "securityContext": kb.container_security(read_only_root=True, run_as_user=UID),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, *mounts],
    }


def _pod(labels: dict, init: list[dict], main: dict, volumes: list[dict], plan: BackupPlan, backoff: int) -> dict:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        # fsGroup: the backup volume is writable by the postgres group.
        "securityContext": kb.pod_security(UID, UID, fs_group=UID),
        "automountServiceAccountToken": False,  # pg_dump and S3 only: no API calls
        "enableServiceLinks": False,
        "containers": [main],
        "volumes": [{"name": "tmp", "emptyDir": {}}, *volumes],
    }
    if init:
        spec["initContainers"] = init
    return {
        "backoffLimit": backoff,
        "activeDeadlineSeconds": plan.settings.deadline_seconds,
        "template": {"metadata": {"labels": labels}, "spec": spec},
    }


def backup_job_spec(plan: BackupPlan) -> dict:
    """The backup Job: PVC target, one postgres container dumps onto the claim and prunes it; S3
    target, the postgres init container dumps into an emptyDir and the python container uploads
    and prunes the bucket."""
    settings, labels = plan.settings, kb.labels(plan.backup_name, BACKUP_COMPONENT)
    dump = dump_script(plan.store, plan.databases)
    if settings.target == "pvc":
        main = _container("backup", plan.postgres_image, ["sh", "-c", dump + prune_script(plan.store, settings.retention)],
                          _postgres_env(plan, BACKUP_DIR), [{"name": "backups", "mountPath": BACKUP_DIR}], plan)
        volumes = [{"name": "backups", "persistentVolumeClaim": {"claimName": plan.claim_name}}]
        return _pod(labels, [], main, volumes, plan, backoff=2)
    work = [{"name": "work", "mountPath": WORK_DIR}]
    init = _container("dump", plan.postgres_image, ["sh", "-c", dump], _postgres_env(plan, WORK_DIR), work, plan)
    env = [*s3_env(settings.s3, plan.namespace, plan.store, plan.s3_secret),
           {"name": "BACKUP_DIR", "value": WORK_DIR}, {"name": "BACKUP_NAME", "value": plan.store},
           {"name": "RETENTION", "value": str(settings.retention)}]
    main = _container("upload", plan.s3_image, ["python3", "-c", S3_CLIENT, "upload"], env, work, plan)
    return _pod(labels, [init], main, [{"name": "work", "emptyDir": {}}], plan, backoff=2)


def restore_job_spec(plan: BackupPlan) -> dict:
    """The restore Job (run by hand): S3 target, the python init container downloads the backup
    into an emptyDir first. `$BACKUP` comes from the optional ConfigMap `<store>-restore`."""
    settings, labels = plan.settings, kb.labels(plan.restore_name, RESTORE_COMPONENT)
    chosen = {"name": "BACKUP", "valueFrom": {"configMapKeyRef": {
        "name": RESTORE_CONFIG_MAP.format(store=plan.store), "key": "backup", "optional": True}}}
    script = ["sh", "-c", restore_script(plan.store, plan.databases)]
    if settings.target == "pvc":
        main = _container("restore", plan.postgres_image, script, [*_postgres_env(plan, BACKUP_DIR), chosen],
                          [{"name": "backups", "mountPath": BACKUP_DIR, "readOnly": True}], plan)
        volumes = [{"name": "backups", "persistentVolumeClaim": {"claimName": plan.claim_name, "readOnly": True}}]
        return _pod(labels, [], main, volumes, plan, backoff=0)
    work = [{"name": "work", "mountPath": WORK_DIR}]
    env = [*s3_env(settings.s3, plan.namespace, plan.store, plan.s3_secret),
           {"name": "BACKUP_DIR", "value": WORK_DIR}, {"name": "BACKUP_NAME", "value": plan.store}, chosen]
    init = _container("download", plan.s3_image, ["python3", "-c", S3_CLIENT, "download"], env, work, plan)
    main = _container("restore", plan.postgres_image, script, _postgres_env(plan, WORK_DIR), work, plan)
    return _pod(labels, [init], main, [{"name": "work", "emptyDir": {}}], plan, backoff=0)


def backup_cron_job_spec(plan: BackupPlan) -> dict:
    return {
        "schedule": plan.settings.schedule,
        # A backup that overruns its interval must not start a second one writing the same store.
        "concurrencyPolicy": "Forbid",
        # Missed (controller down, cluster stopped): still started within the hour.
        "startingDeadlineSeconds": 3600,
        "successfulJobsHistoryLimit": 3,
        "failedJobsHistoryLimit": 3,
        "jobTemplate": {"metadata": {"labels": kb.labels(plan.backup_name, BACKUP_COMPONENT)},
                        "spec": backup_job_spec(plan)},
    }


def restore_cron_job_spec(plan: BackupPlan) -> dict:
    """Suspended and scheduled for a date that never comes: a template for
    `kubectl create job --from=cronjob/<store>-restore`, never run by the controller."""
    return {
        "schedule": NEVER,
        "suspend": True,
        "concurrencyPolicy": "Forbid",
        "successfulJobsHistoryLimit": 1,
        "failedJobsHistoryLimit": 1,
        "jobTemplate": {"metadata": {"labels": kb.labels(plan.restore_name, RESTORE_COMPONENT)},
                        "spec": restore_job_spec(plan)},
    }


def egress_spec(plan: BackupPlan, store: network.Endpoint) -> dict:
    """NetworkPolicy spec: the backup and restore pods reach the server, and the S3 endpoint."""
    rules = [network.to(store)]
    if plan.settings.target == "s3":
        rules.append(network.to(plan.settings.s3.endpoint_peer()))
    pods = {"matchExpressions": [network.names_in([plan.backup_name, plan.restore_name])]}
    return network.spec(pods, ingress_rules=[], egress_rules=rules)


# --- component -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PostgresBackupArgs:
    settings: BackupSettings
    store: str
    """The managed server's name (components/postgres.py)."""
    namespace: pulumi.Input[str]
    """The server's namespace (its Output where the caller has one: the objects then wait for it)."""
    namespace_name: str
    """The same, as text (part of the S3 object keys)."""
    databases: tuple[str, ...]
    credentials_secret: pulumi.Input[str]
    endpoint: network.Endpoint
    """The server, as its clients' egress policies allow it (`Postgres.endpoint`)."""
    depends_on: Sequence[pulumi.Resource] = ()
    image_mirror: Optional[str] = None


class PostgresBackup(Component):
    """Outputs: `backup_name`, `restore_name` (the CronJobs), `claim_name` (pvc target, else None)."""

    def __init__(self, name: str, args: PostgresBackupArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("cloudstation:stores:PostgresBackup", name, None, opts)
        settings = args.settings
        child = self.child_opts()
        plan = BackupPlan(
            store=args.store, namespace=args.namespace_name, databases=tuple(args.databases), credentials_secret="",
            settings=settings, postgres_image=versions.image("postgres", args.image_mirror),
            s3_image=versions.image("backup-s3-client", args.image_mirror),
            s3_secret=object_name(args.store, "backup-s3", 63) if settings.target == "s3" else None,
        )
        needs: list[pulumi.Resource] = list(args.depends_on)
        self.claim_name: Optional[str] = None
        if settings.target == "pvc":
            claim = k8s.core.v1.PersistentVolumeClaim(
                f"{name}-claim",
                metadata=kb.metadata(plan.claim_name, args.namespace, BACKUP_COMPONENT),
                spec=settings.storage.claim_spec(),
                # The backups outlive the stack like the data they copy (docs/cloudstate.md, "What is kept").
                opts=self.child_opts(retain_on_delete=True),
            )
            needs.append(claim)
            self.claim_name = plan.claim_name
        else:
            ref = settings.s3.credentials_secret
            source = k8s.core.v1.Secret.get(f"{name}-s3-source", f"{ref.namespace}/{ref.name}", opts=child)
            copy = k8s.core.v1.Secret(
                f"{name}-s3-credentials",
                metadata=kb.metadata(plan.s3_secret, args.namespace, BACKUP_COMPONENT),
                type="Opaque",
                data=pulumi.Output.secret(source.data).apply(
                    lambda data: {key: s3_key_value(data, key, ref) for key in S3_KEYS}
                ),
                opts=child,
            )
            needs.append(copy)

        def specs(secret: str) -> tuple[dict, dict]:
            resolved = BackupPlan(**{**plan.__dict__, "credentials_secret": secret})
            return backup_cron_job_spec(resolved), restore_cron_job_spec(resolved)

        both = pulumi.Output.from_input(args.credentials_secret).apply(specs)
        # Its pods start only once the policies admitting their connections exist (default deny).
        needs.append(k8s.networking.v1.NetworkPolicy(
            f"{name}-network-policy",
            metadata=kb.metadata(plan.backup_name, args.namespace, BACKUP_COMPONENT),
            spec=egress_spec(plan, args.endpoint),
            opts=child,
        ))
        k8s.batch.v1.CronJob(
            f"{name}-cronjob",
            metadata=kb.metadata(plan.backup_name, args.namespace, BACKUP_COMPONENT),
            spec=both.apply(lambda s: s[0]),
            opts=self.child_opts(depends_on=needs),
        )
        k8s.batch.v1.CronJob(
            f"{name}-restore-cronjob",
            metadata=kb.metadata(plan.restore_name, args.namespace, RESTORE_COMPONENT),
            spec=both.apply(lambda s: s[1]),
            opts=self.child_opts(depends_on=needs),
        )
        self.backup_name = plan.backup_name
        self.restore_name = plan.restore_name
        self.register_outputs({"backupName": self.backup_name, "restoreName": self.restore_name,
                               "claimName": self.claim_name})


def backup_for(postgres: Postgres, settings: BackupSettings, namespace: pulumi.Input[str], namespace_name: str,
               image_mirror: Optional[str], opts: Optional[pulumi.ResourceOptions] = None) -> Optional[PostgresBackup]:
    """The backups of a managed server when enabled (an external server's are its owner's)."""
    if postgres.service_name is None or not settings.enabled:
        return None
    return PostgresBackup(
        f"{postgres.service_name}-backup",
        PostgresBackupArgs(
            settings=settings, store=postgres.service_name, namespace=namespace, namespace_name=namespace_name,
            databases=tuple(postgres.databases),
            credentials_secret=postgres.secret_name, endpoint=postgres.endpoint,
            depends_on=[*postgres.ready, *postgres.policies],
            image_mirror=image_mirror,
        ),
        opts,
    )
