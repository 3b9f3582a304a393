"""Backups of the managed PostgreSQL stores (components/postgres_backup.py, docs/backups.md).

The scripts the backup and restore CronJobs run are taken from the rendered stacks and run here,
as they are, against a real PostgreSQL (Debian's `postgresql`, started per module) and, for the S3
target, a moto S3 server that checks every request's Signature Version 4 and an IAM policy. Only
what differs between a pod and this machine is set from outside: the values the pod reads from
Secrets, the server's address and the directory its volume is mounted at. A restore must give back
exactly the dumped data: `pg_dump` of every database before the backup and after the restore are
equal, byte for byte.
"""
from __future__ import annotations

import base64
import glob
import io
import ipaddress
import json
import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import boto3
import pytest
import requests

from components import network
from components import postgres_backup as backup
from infra import versions
from cloudstation_tools import checks, engine, render
from infra.config import ConfigError, load
from cloudstation_tools.mocks import is_wrapped_secret
from tests import stacks
from tests.stacks import edited
from tests.conftest import objects, pod_spec, standard_violations, validation_problems
from tests.test_network_policies import INTERNET, Address, cluster_of
from tests.test_policy import RESOURCE_POLICIES, check_resource

PASSWORD = "backup-test-password"
USER = "cloudstate"
S3_CIDR = "52.218.0.0/17"
S3_ENDPOINT = "https://s3.eu-west-1.amazonaws.com"
S3_SETTINGS = {"target": "s3", "retention": 3, "s3": {
    "endpoint": S3_ENDPOINT, "bucket": "cloudstation-backups", "prefix": "clusters/kind", "region": "eu-west-1",
    "credentialsSecret": {"namespace": "ops", "name": "backup-s3"}, "cidrs": [S3_CIDR]}}


# --- the rendered objects ------------------------------------------------------------------------


def backups_setting(stack: str) -> backup.BackupSettings:
    """`platform.stores.backups` of a stack file (prod as promoted), or of the S3 variant."""
    if stack == "s3":
        return backup.BackupSettings.model_validate(S3_SETTINGS)
    return stacks.validate_config(stack).platform.stores.backups


def managed_servers(rendered) -> list[dict]:
    """The StatefulSets of the managed PostgreSQL servers (by their image, the postgres pin)."""
    return [o for o in objects(rendered, "StatefulSet")
            if pod_spec(o)["containers"][0]["image"].startswith(versions.split(versions.IMAGES["postgres"])[0] + ":")]


def cron_job(rendered, name: str, namespace: str) -> dict:
    [found] = [o for o in objects(rendered, "CronJob")
               if o["metadata"]["name"] == name and o["metadata"]["namespace"] == namespace]
    return found


def job_pod(cron: dict) -> dict:
    return cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def containers(cron: dict) -> dict[str, dict]:
    spec = job_pod(cron)
    return {c["name"]: c for c in [*spec.get("initContainers", []), *spec["containers"]]}


def store_of(rendered, namespace: str) -> str:
    [server] = [s for s in managed_servers(rendered) if s["metadata"]["namespace"] == namespace]
    return server["metadata"]["name"]


def databases_of(cron: dict) -> list[str]:
    script = containers(cron)[("backup" if "backup" in containers(cron) else "dump")]["args"][-1]
    return re.findall(r"--dbname=(\w+)", script)


def s3_stack_file() -> render.StackFile:
    return edited("test", platform=lambda p: {**p, "stores": {**p.get("stores", {}), "backups": S3_SETTINGS}})


@pytest.fixture(scope="module")
def s3_stack() -> render.Rendered:
    """The test stack with its backups in S3 (an AWS endpoint reached at its CIDR)."""
    return stacks.render("test", stack_file=s3_stack_file())


# --- a real PostgreSQL ---------------------------------------------------------------------------


def pg_tool(name: str) -> str:
    """A PostgreSQL server program (Debian keeps them in /usr/lib/postgresql/<major>/bin)."""
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]))
    path = found[-1] if found else shutil.which(name)
    if not path:
        pytest.fail(f"PostgreSQL's {name} is missing: `apt-get install -y postgresql` (scripts/test.sh installs it)")
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    port: int
    bindir: str

    def env(self, **extra: str) -> dict:
        return {"PATH": f"{self.bindir}:{Path(sys.executable).parent}:{os.environ['PATH']}", "LANG": "C.UTF-8",
                "PGHOST": "127.0.0.1", "PGPORT": str(self.port), "PGUSER": USER, "PGPASSWORD": PASSWORD, **extra}

    def psql(self, database: str, sql: str) -> str:
        done = subprocess.run([f"{self.bindir}/psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", database],
                              input=sql, env=self.env(), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def dump(self, database: str) -> bytes:
        """The database as plain SQL: what a restore must give back exactly."""
        # Since 17.6/16.10/15.14 a plain dump starts with `\\restrict <random key>`: fix the key.
        help_text = subprocess.run([f"{self.bindir}/pg_dump", "--help"], capture_output=True, text=True).stdout
        fixed = ["--restrict-key=cloudstationtest"] if "--restrict-key" in help_text else []
        done = subprocess.run([f"{self.bindir}/pg_dump", "--format=plain", *fixed, "-d", database], env=self.env(),
                              capture_output=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def fresh(self, *databases: str) -> None:
        for database in databases:
            self.psql("postgres", f"DROP DATABASE IF EXISTS {database} WITH (FORCE);")
            self.psql("postgres", f"CREATE DATABASE {database};")


@pytest.fixture(scope="module")
def server() -> Server:
    """PostgreSQL with a password-authenticated superuser `cloudstate`, as the official image
    creates POSTGRES_USER; reached over TCP like the pods reach the store's Service."""
    # Directly under /tmp: run as `postgres`, the server cannot enter pytest's root-only directories.
    base = Path(tempfile.mkdtemp(prefix="cloudstation-postgres-"))
    (base / "password").write_text(PASSWORD)
    run_as: list[str] = []
    if os.geteuid() == 0:  # the server refuses to run as root
        account = pwd.getpwnam("postgres")
        for path in (base, base / "password"):
            os.chown(path, account.pw_uid, account.pw_gid)
        run_as = ["runuser", "-u", "postgres", "--"]
    data, port = base / "data", free_port()
    initdb = subprocess.run([*run_as, pg_tool("initdb"), "-D", str(data), "-U", USER, f"--pwfile={base / 'password'}",
                             "--auth=scram-sha-256", "--encoding=UTF8", "--locale=C.UTF-8"],
                            capture_output=True, text=True, timeout=300)
    assert initdb.returncode == 0, initdb.stderr
    options = f"-c listen_addresses=127.0.0.1 -p {port} -k {base} -c fsync=off"
    start = subprocess.run([*run_as, pg_tool("pg_ctl"), "-D", str(data), "-l", str(base / "log"), "-w", "-t", "60",
                            "-o", options, "start"], capture_output=True, text=True, timeout=120)
    assert start.returncode == 0, start.stderr + (base / "log").read_text(errors="replace")
    try:
        yield Server(port, str(Path(pg_tool("initdb")).parent))
    finally:
        subprocess.run([*run_as, pg_tool("pg_ctl"), "-D", str(data), "-m", "immediate", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(base, ignore_errors=True)


def seed(server: Server, database: str, payload_bytes: int = 0) -> None:
    """Tables of the kinds the stores hold (a journal with bytea payloads, sequences, JSON, NULLs,
    Unicode), an index, a view and a function."""
    server.psql(database, f"""
        CREATE TABLE journal (ordering BIGSERIAL PRIMARY KEY, persistence_id TEXT NOT NULL, sequence_number BIGINT NOT NULL,
                              deleted BOOLEAN DEFAULT FALSE, tags TEXT[], message BYTEA NOT NULL, meta JSONB,
                              written TIMESTAMPTZ NOT NULL DEFAULT '2026-01-01 00:00:00+00');
        CREATE UNIQUE INDEX journal_pid_seq ON journal (persistence_id, sequence_number);
        INSERT INTO journal (persistence_id, sequence_number, tags, message, meta)
            SELECT 'cart-' || (i % 17), i, ARRAY['t' || (i % 3)], decode(md5(i::text), 'hex'),
                   CASE WHEN i % 5 = 0 THEN NULL ELSE jsonb_build_object('n', i, 'text', 'Grüße ✓ {database}') END
            FROM generate_series(1, 5000) AS i;
        CREATE TABLE snapshot (persistence_id TEXT PRIMARY KEY, snapshot BYTEA);
        INSERT INTO snapshot VALUES ('big', '\\x00'::bytea);
        CREATE VIEW carts AS SELECT persistence_id, count(*) FROM journal GROUP BY persistence_id;
        CREATE FUNCTION events(pid TEXT) RETURNS BIGINT LANGUAGE sql AS $$ SELECT count(*) FROM journal WHERE persistence_id = pid $$;
        SELECT setval('journal_ordering_seq', 123456);
    """)
    if payload_bytes:
        # Incompressible, so the dump is as large (an S3 upload in several parts).
        server.psql(database, "UPDATE snapshot SET snapshot = (SELECT decode(string_agg(md5(random()::text || i), ''), 'hex') "
                              f"FROM generate_series(1, {payload_bytes // 16}) AS i);")


def mutate(server: Server, database: str) -> None:
    """What happens after a backup: rows change and go, a table appears, the sequence moves on."""
    server.psql(database, """
        DELETE FROM journal WHERE sequence_number % 2 = 0;
        UPDATE snapshot SET snapshot = '\\x01';
        CREATE TABLE added_later (id INT);
        SELECT setval('journal_ordering_seq', 999999);
        DROP VIEW carts;
    """)


def run(container: dict, server: Server, **overrides: str) -> subprocess.CompletedProcess:
    """Run a rendered container's command and args here: its literal environment, and from
    `overrides` what the pod reads from Secrets plus what differs here (the server's address, the
    directory its volume is mounted at, the S3 endpoint)."""
    literal = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    from_refs = {e["name"] for e in container.get("env", []) if "valueFrom" in e}
    optional = {e["name"] for e in container.get("env", []) if
                ((e.get("valueFrom") or {}).get("configMapKeyRef") or {}).get("optional")}
    env = {**server.env(), **literal, "PGHOST": "127.0.0.1", "PGPORT": str(server.port), **overrides}
    env = {k: v for k, v in env.items() if k not in from_refs or k in overrides or k in ("PGUSER", "PGPASSWORD")}
    assert from_refs - optional <= env.keys(), "a value the pod reads from a Secret is not set here"
    return subprocess.run([*container["command"], *container["args"]], env=env, capture_output=True, text=True,
                          timeout=300)


def backups_in(directory: Path, store: str) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if re.fullmatch(backup.file_pattern(store), p.name))


def project_with_postgres(rendered) -> str:
    """The namespace of the stack file's first project with a managed PostgreSQL store."""
    namespaces = rendered.outputs["projectNamespaces"]
    servers = {s["metadata"]["namespace"] for s in managed_servers(rendered)}
    [namespace, *_] = [namespaces[p] for p in namespaces if namespaces[p] in servers]
    return namespace


STORES = {"project": project_with_postgres, "armada": lambda r: r.outputs["armadaNamespace"]}
"""The stores the round trips run on: a project's (one database) and Armada's (two)."""


def pvc_jobs(rendered_stacks, which: str) -> tuple[str, dict, dict]:
    rendered = rendered_stacks["test"]
    namespace = STORES[which](rendered)
    store = store_of(rendered, namespace)
    return (store, cron_job(rendered, backup.object_name(store, "backup"), namespace),
            cron_job(rendered, backup.object_name(store, "restore"), namespace))


# --- PVC target: backup and restore against a real PostgreSQL ------------------------------------


@pytest.mark.parametrize("which", list(STORES))
def test_a_restore_gives_back_every_database_byte_equal(which, rendered_stacks, server, tmp_path):
    store, backup_cron, restore_cron = pvc_jobs(rendered_stacks, which)
    databases = databases_of(backup_cron)
    assert databases and (which != "armada" or sorted(databases) == ["lookout", "scheduler"])
    server.fresh(*databases)
    for database in databases:
        seed(server, database)
    before = {db: server.dump(db) for db in databases}

    done = run(containers(backup_cron)["backup"], server, BACKUP_DIR=str(tmp_path))
    assert done.returncode == 0, done.stderr
    [name] = backups_in(tmp_path, store)
    with tarfile.open(tmp_path / name) as archive:
        assert sorted(archive.getnames()) == sorted(["SHA256SUMS", *(f"{db}.dump" for db in databases)])
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".partial-")] == []

    for database in databases:
        mutate(server, database)
        assert server.dump(database) != before[database]
    # A client still connected (an entity's proxy that was not stopped) is disconnected, not waited for.
    holder = subprocess.Popen([f"{server.bindir}/psql", "-d", databases[0], "-c", "SELECT pg_sleep(60)"],
                              env=server.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        done = run(containers(restore_cron)["restore"], server, BACKUP_DIR=str(tmp_path))
    finally:
        holder.kill()
        holder.wait()
    assert done.returncode == 0, done.stderr
    assert f"restoring {name}" in done.stdout
    for database in databases:
        assert server.dump(database) == before[database], database
    assert server.psql("postgres", "SELECT count(*) FROM pg_database WHERE datname LIKE 'cloudstation_restore_%'").strip() == "0"


def test_retention_keeps_the_newest_backups_and_nothing_else_is_touched(rendered_stacks, server, tmp_path):
    store, backup_cron, _ = pvc_jobs(rendered_stacks, "project")
    server.fresh(*databases_of(backup_cron))
    retention = backups_setting("test").retention
    assert f"tail -n +{retention + 1}" in containers(backup_cron)["backup"]["args"][-1]
    older = [f"{store}-2025010{day}T023000Z.tar" for day in range(1, retention + 2)]
    others = ["notes.txt", "other-store-20200101T000000Z.tar", f"{store}-20250101T023000Z.tar.bak"]
    for name in [*older, *others]:
        (tmp_path / name).write_bytes(b"x")
    stale, running = tmp_path / ".partial-20250101T023000Z-abcdef", tmp_path / ".partial-20260101T023000Z-ghijkl"
    stale.mkdir()
    running.mkdir()
    two_days_ago = time.time() - 2 * 86400
    os.utime(stale, (two_days_ago, two_days_ago))

    done = run(containers(backup_cron)["backup"], server, BACKUP_DIR=str(tmp_path))
    assert done.returncode == 0, done.stderr
    kept = backups_in(tmp_path, store)
    assert len(kept) == retention
    assert kept[:-1] == older[-(retention - 1):]  # the newest older ones, then today's
    assert kept[-1] > older[-1]
    assert all((tmp_path / name).exists() for name in others)
    assert not stale.exists() and running.exists()


def test_a_named_backup_is_restored_and_bad_or_corrupt_ones_leave_the_data(rendered_stacks, server, tmp_path):
    store, backup_cron, restore_cron = pvc_jobs(rendered_stacks, "project")
    [database] = databases_of(backup_cron)
    server.fresh(database)
    seed(server, database)
    first = server.dump(database)
    assert run(containers(backup_cron)["backup"], server, BACKUP_DIR=str(tmp_path)).returncode == 0
    [name] = backups_in(tmp_path, store)
    older = f"{store}-20250101T000000Z.tar"
    (tmp_path / name).rename(tmp_path / older)
    mutate(server, database)
    second = server.dump(database)
    assert run(containers(backup_cron)["backup"], server, BACKUP_DIR=str(tmp_path)).returncode == 0
    restore = containers(restore_cron)["restore"]

    # Names that are not backups of this store, and a backup whose dump changed since its sums.
    newest = backups_in(tmp_path, store)[-1]
    with tarfile.open(tmp_path / newest) as archive:
        members = {m.name: archive.extractfile(m).read() for m in archive.getmembers()}
    members[f"{database}.dump"] = members[f"{database}.dump"][:-1] + bytes([members[f"{database}.dump"][-1] ^ 1])
    corrupt = f"{store}-20240101T000000Z.tar"
    with tarfile.open(tmp_path / corrupt, "w") as archive:
        for member, data in members.items():
            info = tarfile.TarInfo(member)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    for bad in ("../../etc/passwd", f"{store}-20990101T000000Z.tar", "notes.txt", corrupt):
        done = run(restore, server, BACKUP_DIR=str(tmp_path), BACKUP=bad)
        assert done.returncode != 0, bad
        assert server.dump(database) == second, bad

    done = run(restore, server, BACKUP_DIR=str(tmp_path), BACKUP=older)
    assert done.returncode == 0, done.stderr
    assert server.dump(database) == first


def test_a_failed_backup_leaves_nothing_that_looks_like_a_backup(rendered_stacks, server, tmp_path):
    store, backup_cron, _ = pvc_jobs(rendered_stacks, "project")
    server.fresh(*databases_of(backup_cron))
    kept = f"{store}-20250101T000000Z.tar"
    (tmp_path / kept).write_bytes(b"x")
    done = run(containers(backup_cron)["backup"], server, BACKUP_DIR=str(tmp_path), PGPASSWORD="wrong")
    assert done.returncode != 0
    assert "password authentication failed" in done.stderr
    assert backups_in(tmp_path, store) == [kept]


def test_restore_without_any_backup_fails_clearly(rendered_stacks, server, tmp_path):
    store, _, restore_cron = pvc_jobs(rendered_stacks, "project")
    done = run(containers(restore_cron)["restore"], server, BACKUP_DIR=str(tmp_path))
    assert done.returncode == 1
    assert f"no backup to restore: '' is not a backup of {store}" in done.stderr


# --- S3 target: the same scripts, uploads to and downloads from moto --------------------------


@dataclass
class S3:
    url: str
    access_key: str
    secret_key: str

    def client(self):
        return boto3.client("s3", endpoint_url=self.url, region_name="eu-west-1",
                            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key)


def least_privilege_policy(bucket: str, prefix: str) -> dict:
    """The IAM policy docs/backups.md asks for: list the bucket, and write, read and delete below the prefix."""
    return {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": f"arn:aws:s3:::{bucket}"},
        {"Effect": "Allow", "Action": ["s3:PutObject", "s3:GetObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
         "Resource": f"arn:aws:s3:::{bucket}/{prefix}/*"}]}


@pytest.fixture(scope="module")
def s3(tmp_path_factory) -> S3:
    """moto's S3 server in its own process, checking signatures and IAM policies (auth enabled
    after the bucket and the backup user with the documented policy were created)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                requests.get(f"{url}/moto-api/", timeout=1)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline, "moto_server did not start"
                time.sleep(0.1)
        settings = S3_SETTINGS["s3"]
        admin = dict(endpoint_url=url, region_name="eu-west-1", aws_access_key_id="admin", aws_secret_access_key="admin")
        boto3.client("s3", **admin).create_bucket(Bucket=settings["bucket"],
                                                  CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
        iam = boto3.client("iam", **admin)
        iam.create_user(UserName="backup")
        key = iam.create_access_key(UserName="backup")["AccessKey"]
        iam.put_user_policy(UserName="backup", PolicyName="backups",
                            PolicyDocument=json.dumps(least_privilege_policy(settings["bucket"], settings["prefix"])))
        assert requests.post(f"{url}/moto-api/reset-auth", data=b"0", timeout=5).ok
        yield S3(url, key["AccessKeyId"], key["SecretAccessKey"])
    finally:
        process.terminate()
        process.wait(timeout=30)


def s3_jobs(s3_stack) -> tuple[str, str, dict, dict]:
    namespace = project_with_postgres(s3_stack)
    store = store_of(s3_stack, namespace)
    return (store, namespace, cron_job(s3_stack, backup.object_name(store, "backup"), namespace),
            cron_job(s3_stack, backup.object_name(store, "restore"), namespace))


def test_s3_backup_uploads_in_parts_prunes_and_restores_byte_equal(s3_stack, server, s3, tmp_path):
    store, namespace, backup_cron, restore_cron = s3_jobs(s3_stack)
    settings = S3_SETTINGS["s3"]
    prefix = f"{settings['prefix']}/{namespace}/{store}/"
    [database] = databases_of(backup_cron)
    server.fresh(database)
    seed(server, database, payload_bytes=12 * 1024 * 1024)
    before = server.dump(database)
    bucket = s3.client()
    retention = S3_SETTINGS["retention"]
    older = [f"{prefix}{store}-2025010{day}T023000Z.tar" for day in range(1, retention + 2)]
    others = [f"{prefix}notes.txt", f"{settings['prefix']}/{namespace}/other-store/other-store-20200101T000000Z.tar"]
    for key in [*older, *others]:
        bucket.put_object(Bucket=settings["bucket"], Key=key, Body=b"x")
    secrets = dict(S3_ENDPOINT=s3.url, AWS_ACCESS_KEY_ID=s3.access_key, AWS_SECRET_ACCESS_KEY=s3.secret_key)
    job = containers(backup_cron)
    assert job["upload"]["env"][0] == {"name": "S3_ENDPOINT", "value": S3_ENDPOINT}

    work = tmp_path / "backup-work"
    work.mkdir()
    done = run(job["dump"], server, BACKUP_DIR=str(work))
    assert done.returncode == 0, done.stderr
    # moto's smallest part is 5 MiB (the pod's default is 16 MiB); pages of 2 keys make the listing
    # follow continuation tokens.
    done = run(job["upload"], server, BACKUP_DIR=str(work), S3_PART_SIZE=str(5 * 1024 * 1024), S3_LIST_PAGE="2",
               **secrets)
    assert done.returncode == 0, done.stderr
    listed = sorted(o["Key"] for o in bucket.list_objects_v2(Bucket=settings["bucket"])["Contents"])
    kept = [k for k in listed if k.startswith(prefix) and k.endswith(".tar")]
    assert len(kept) == retention and kept[:-1] == older[-(retention - 1):]
    assert set(others) <= set(listed)
    [uploaded] = backups_in(work, store)
    assert kept[-1] == prefix + uploaded
    head = bucket.head_object(Bucket=settings["bucket"], Key=kept[-1])
    assert head["ContentLength"] == (work / uploaded).stat().st_size > 10 * 1024 * 1024
    assert re.search(r"-[3-9]\"?$", head["ETag"]), head["ETag"]  # a multipart upload of 3 or more parts

    mutate(server, database)
    restore = containers(restore_cron)
    download = tmp_path / "restore-work"
    download.mkdir()
    done = run(restore["download"], server, BACKUP_DIR=str(download), S3_LIST_PAGE="2", **secrets)
    assert done.returncode == 0, done.stderr
    assert backups_in(download, store) == [uploaded]
    done = run(restore["restore"], server, BACKUP_DIR=str(download))
    assert done.returncode == 0, done.stderr
    assert server.dump(database) == before


def test_s3_requests_are_signed_and_limited_to_the_prefix(s3_stack, server, s3, tmp_path):
    """moto recomputes every request's signature (botocore's S3SigV4Auth) and applies the IAM
    policy: a wrong secret key is refused, and so is a prefix the policy does not grant."""
    store, namespace, backup_cron, restore_cron = s3_jobs(s3_stack)
    (tmp_path / f"{store}-20250101T000000Z.tar").write_bytes(b"x")
    upload = containers(backup_cron)["upload"]
    secrets = dict(S3_ENDPOINT=s3.url, AWS_ACCESS_KEY_ID=s3.access_key)
    done = run(upload, server, BACKUP_DIR=str(tmp_path), AWS_SECRET_ACCESS_KEY="not-the-key", **secrets)
    assert done.returncode != 0 and "SignatureDoesNotMatch" in done.stderr
    done = run(upload, server, BACKUP_DIR=str(tmp_path), AWS_SECRET_ACCESS_KEY=s3.secret_key, S3_PREFIX="elsewhere/", **secrets)
    assert done.returncode != 0 and "AccessDenied" in done.stderr
    done = run(containers(restore_cron)["download"], server, BACKUP_DIR=str(tmp_path), BACKUP="../other.tar",
               AWS_SECRET_ACCESS_KEY=s3.secret_key, **secrets)
    assert done.returncode != 0 and "is not a backup name" in done.stderr


def test_the_s3_client_script_is_the_one_the_pods_run(s3_stack):
    _, _, backup_cron, restore_cron = s3_jobs(s3_stack)
    assert containers(backup_cron)["upload"]["args"] == ["-c", backup.S3_CLIENT, "upload"]
    assert containers(restore_cron)["download"]["args"] == ["-c", backup.S3_CLIENT, "download"]
    assert containers(backup_cron)["upload"]["image"] == versions.image("backup-s3-client")
    assert versions.has_digest("backup-s3-client")
    compile(backup.S3_CLIENT, "s3-client", "exec")


# --- what the stacks deploy ----------------------------------------------------------------------


@pytest.fixture(params=["test", "prod", "s3"])
def deployed(request, rendered_stacks, s3_stack) -> tuple[render.Rendered, backup.BackupSettings]:
    """Each stack file, and the test stack with its backups in S3, with its backup settings."""
    rendered = s3_stack if request.param == "s3" else rendered_stacks[request.param]
    return rendered, backups_setting(request.param)


def test_every_managed_postgres_has_a_scheduled_backup_and_a_restore(deployed):
    deployed, settings = deployed
    servers = managed_servers(deployed)
    assert servers
    for server_ in servers:
        store, namespace = server_["metadata"]["name"], server_["metadata"]["namespace"]
        cron = cron_job(deployed, backup.object_name(store, "backup"), namespace)
        spec = cron["spec"]
        assert spec["schedule"] == settings.schedule and "suspend" not in spec
        assert spec["concurrencyPolicy"] == "Forbid" and spec["startingDeadlineSeconds"] > 0
        assert spec["successfulJobsHistoryLimit"] >= 1 and spec["failedJobsHistoryLimit"] >= 1
        assert spec["jobTemplate"]["spec"]["activeDeadlineSeconds"] == settings.deadline_seconds
        restore = cron_job(deployed, backup.object_name(store, "restore"), namespace)["spec"]
        assert restore["suspend"] is True and restore["schedule"] == backup.NEVER
        for job in (cron, cron_job(deployed, backup.object_name(store, "restore"), namespace)):
            pod = job_pod(job)
            assert pod["automountServiceAccountToken"] is False and pod["restartPolicy"] == "Never"
            for container in containers(job).values():
                env = {e["name"]: e for e in container["env"]}
                assert container["securityContext"]["readOnlyRootFilesystem"] is True
                assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
                assert container["image"] in (versions.image("postgres"), versions.image("backup-s3-client"))
                if container["image"] == versions.image("postgres"):
                    assert env["PGHOST"]["value"] == store
                    assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": f"{store}-credentials", "key": "password"}
        assert standard_violations([cron]) == []
        assert checks.argument_credential_violations(store, job_pod(cron)) == []


def test_the_backup_volume_is_kept_when_the_stack_drops_it(deployed):
    deployed, settings = deployed
    claims = [r for r in deployed.registrations if r.custom and isinstance(r.inputs, dict)
              and r.inputs.get("kind") == "PersistentVolumeClaim"
              and r.inputs["metadata"]["labels"]["app.kubernetes.io/component"] == backup.BACKUP_COMPONENT]
    assert len(claims) == (len(managed_servers(deployed)) if settings.target == "pvc" else 0)
    for claim in claims:
        assert claim.options.get("retainOnDelete") is True, claim.name
        assert claim.inputs["spec"]["resources"]["requests"]["storage"] == settings.storage.size


def test_s3_credentials_are_copied_from_the_named_secret_never_config(s3_stack):
    _, namespace, backup_cron, _ = s3_jobs(s3_stack)
    upload = {e["name"]: e for e in containers(backup_cron)["upload"]["env"]}
    secret = upload["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]
    assert secret["key"] == "secretAccessKey"
    assert upload["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"] == {"name": secret["name"], "key": "accessKeyId"}
    [copy] = [o for o in objects(s3_stack, "Secret") if o["metadata"]["name"] == secret["name"]]
    assert copy["metadata"]["namespace"] == namespace and set(copy["data"]) == set(backup.S3_KEYS)
    # The values are those of the Secret named in config (the mocks' existing `ops/backup-s3`).
    [registered] = [r for r in s3_stack.registrations if isinstance(r.inputs, dict) and r.inputs.get("kind") == "Secret"
                    and r.inputs["metadata"]["name"] == secret["name"]]
    data = registered.inputs["data"]
    data = data["value"] if is_wrapped_secret(data) else data
    assert {k: base64.b64decode(v).decode() for k, v in data.items()} == {k: f"{k}-of-ops/backup-s3" for k in backup.S3_KEYS}
    text = json.dumps([o for o in s3_stack.manifests() if o["kind"] != "Secret"])
    assert "accessKeyId-of-ops/backup-s3" not in text and "secretAccessKey-of" not in text


def test_backup_pods_reach_their_server_and_the_bucket_only(rendered_stacks, s3_stack):
    for pair in (rendered_stacks, {"s3": s3_stack}):
        cluster = cluster_of(pair)
        pods = [p for p in cluster.pods if p.labels.get("app.kubernetes.io/component")
                in (backup.BACKUP_COMPONENT, backup.RESTORE_COMPONENT)]
        assert pods
        for pod in pods:
            [server_] = [p for p in cluster.pods if p.namespace == pod.namespace
                         and p.labels.get("app.kubernetes.io/component") == "database"
                         and pod.name in (backup.object_name(p.name, "backup"), backup.object_name(p.name, "restore"))]
            assert cluster.allowed(pod, server_, 5432), pod.name
            assert not cluster.allowed(pod, Address(INTERNET), 443), pod.name
            assert not cluster.allowed(pod, server_, 5433), pod.name
            for other in cluster.pods:
                if other.namespace != pod.namespace and other.labels.get("app.kubernetes.io/component") == "database":
                    assert not cluster.allowed(pod, other, 5432), (pod.name, other.name)
            in_bucket_range = Address(str(next(ipaddress.ip_network(S3_CIDR).hosts())))
            assert cluster.allowed(pod, in_bucket_range, 443) == (pair.get("s3") is s3_stack), pod.name
            assert not cluster.allowed(pod, in_bucket_range, 80), pod.name


def test_backups_of_the_variants_validate_against_the_schemas(s3_stack):
    assert validation_problems(s3_stack) == []
    assert standard_violations(s3_stack.manifests()) == []


@pytest.mark.parametrize("policy", RESOURCE_POLICIES, ids=lambda p: p.name)
def test_the_policy_pack_passes_the_s3_backup_objects(policy, s3_stack, monkeypatch):
    """The repo's stacks (PVC target) go through the pack in tests/test_policy.py; the S3 target's
    objects (the uploader's script in its arguments, the copied Secret) here."""
    monkeypatch.setenv("PULUMI_CONFIG", json.dumps(s3_stack_file().values))
    monkeypatch.setenv("PULUMI_STACK", "test")
    mine = [r for r in s3_stack.registrations if r.custom and "cloudstation:stores:PostgresBackup" in r.urn]
    assert {r.type for r in mine} >= {"kubernetes:batch/v1:CronJob", "kubernetes:core/v1:Secret",
                                      "kubernetes:networking.k8s.io/v1:NetworkPolicy"}
    assert [v for r in mine for v in check_resource(policy, r.type, r.inputs, name=r.name)] == []


def test_cron_jobs_are_not_awaited_and_the_claim_is_ready_while_it_waits_for_its_first_pod(s3_stack, rendered_stacks):
    """pulumi-kubernetes 4.34.2 has no awaiter for CronJobs (provider/pkg/await/awaiters.go: none
    for batch/v1/CronJob), so `pulumi up` does not wait for a backup; the claim's await passes
    while Pending under a WaitForFirstConsumer class (`untilCoreV1PersistentVolumeClaimReady`),
    which the backup pod only consumes at its first run."""
    graph = engine.Graph(rendered_stacks["test"].resources())
    jobs = [o for o in graph.objects if o.kind == "CronJob" and
            (o.meta.get("labels") or {}).get("app.kubernetes.io/component") in (backup.BACKUP_COMPONENT, backup.RESTORE_COMPONENT)]
    assert jobs and all(engine.awaited(o) is None for o in jobs)
    claims = [o for o in graph.objects if o.kind == "PersistentVolumeClaim"
              and (o.meta.get("labels") or {}).get("app.kubernetes.io/component") == backup.BACKUP_COMPONENT]
    assert claims and all(engine.readiness_problems(graph, c) == [] for c in claims)
    assert engine.await_problems(engine.Graph(s3_stack.resources())) == []


def test_external_and_disabled_stores_get_no_backups():
    """An external server's backups are its owner's; `enabled: false` turns them off."""
    external = stacks.rendered("non-owner")  # external PostgreSQL, Cassandra projects, no Armada
    assert managed_servers(external) == []
    assert [o for o in objects(external, "CronJob")] == []
    off = stacks.render("prod", stack_file=edited(
        "prod", platform=lambda p: {**p, "stores": {**p.get("stores", {}), "backups": {"enabled": False}}}))
    assert managed_servers(off) and [o for o in objects(off, "CronJob")] == []


# --- config and names ----------------------------------------------------------------------------


def load_problems(backups: dict) -> list[str]:
    stack_file = edited("test", platform=lambda p: {**p, "stores": {**p.get("stores", {}), "backups": backups}})
    with pytest.raises(ConfigError) as caught:
        load(stack_file.values)
    return caught.value.problems


KEY = "cloudstation:platform.stores.backups"


@pytest.mark.parametrize("backups, key, expected", [
    ({"schedule": "every night"}, "schedule", "must be a cron schedule in UTC"),
    ({"schedule": "61 2 * * *"}, "schedule", "five fields"),
    ({"schedule": "CRON_TZ=Europe/Berlin 0 2 * * *"}, "schedule", "five fields"),
    ({"retention": 0}, "retention", "greater than or equal to 1"),
    ({"target": "tape"}, "target", "'pvc' or 's3'"),
    ({"target": "s3"}, "s3", "required when mode is 's3'"),
    ({"target": "s3", "s3": S3_SETTINGS["s3"], "storage": {"size": "1Gi"}}, "storage", "only allowed when mode is 'pvc'"),
    ({"s3": S3_SETTINGS["s3"]}, "s3", "only allowed when mode is 's3'"),
    ({"target": "s3", "s3": {**S3_SETTINGS["s3"], "endpoint": "http://s3.example.com"}}, "s3.endpoint", "must be https://"),
    ({"target": "s3", "s3": {**S3_SETTINGS["s3"], "endpoint": "https://s3.example.com/bucket"}}, "s3.endpoint", "without path"),
    ({"target": "s3", "s3": {**S3_SETTINGS["s3"], "cidrs": []}}, "s3.cidrs", "required for a server outside the cluster"),
    ({"target": "s3", "s3": {**S3_SETTINGS["s3"], "cidrs": ["0.0.0.0/0"]}}, "s3.cidrs[0]", "matches every address"),
    ({"target": "s3", "s3": {**S3_SETTINGS["s3"], "bucket": "Bad_Bucket"}}, "s3.bucket", "should match pattern"),
    ({"target": "s3", "s3": {**S3_SETTINGS["s3"], "accessKeyId": "AKIA..."}}, "s3.accessKeyId", "unknown key"),
])
def test_bad_backup_config_names_the_key(backups, key, expected):
    [problem] = load_problems(backups)
    assert problem.startswith(f"{KEY}.{key}: "), problem
    assert expected in problem, problem


def test_good_backup_config_loads():
    in_cluster = {"target": "s3", "s3": {**S3_SETTINGS["s3"], "endpoint": "http://minio.backups.svc:9000", "cidrs": []}}
    for backups in ({"schedule": "@daily", "retention": 30}, {"schedule": "*/15 1-5 * jan,JUL mon-fri"}, in_cluster,
                    {"target": "s3", "s3": {**S3_SETTINGS["s3"], "cidrs": [], "allowAnyAddress": True}}):
        stack_file = edited("test", platform=lambda p: {**p, "stores": {**p.get("stores", {}), "backups": backups}})
        assert load(stack_file.values).platform.stores.backups.enabled
    minio = backup.BackupSettings.model_validate(in_cluster).s3.endpoint_peer()
    assert minio == network.Endpoint(ports=(9000,), peers=(network.namespace_peer("backups"),))


def test_object_names_fit_the_cron_job_limit_and_stay_distinct():
    long_store = "p" * 40 + "-postgres"
    names = {backup.object_name(long_store, "backup"), backup.object_name(long_store, "restore"),
             backup.object_name("q" * 40 + "-postgres", "backup")}
    assert len(names) == 3 and all(len(n) <= backup.CRONJOB_NAME_MAX for n in names)
    assert backup.object_name(long_store, "backup") == backup.object_name(long_store, "backup")
    assert backup.object_name("shop-postgres", "backup") == "shop-postgres-backup"
    assert re.fullmatch(backup.file_pattern("shop-postgres"), "shop-postgres-20260101T023000Z.tar")
    assert not re.fullmatch(backup.file_pattern("shop-postgres"), "shop-postgres-x-20260101T023000Z.tar")


@pytest.mark.parametrize("suffix", ["backup", "restore"])
def test_an_entity_may_not_take_the_name_of_the_backup_objects(suffix):
    """`<project>-postgres-backup` is the backup's NetworkPolicy and its pods' name label."""
    entity = f"postgres-{suffix}"
    stack_file = edited("test", projects=lambda projects: [
        {**projects[0], "store": "postgres",
         "entities": [*projects[0]["entities"], {**projects[0]["entities"][0], "name": entity}]}])
    with pytest.raises(ConfigError) as caught:
        load(stack_file.values)
    [problem] = caught.value.problems
    assert f"'{entity}' — " in problem and "is already used by the project's postgres store" in problem


def test_docs_describe_the_backups_and_the_iam_policy():
    text = (Path(__file__).resolve().parent.parent / "docs" / "backups.md").read_text()
    for needed in ("kubectl", "create job", "--from=cronjob/", "nodetool snapshot", "retention", "schedule",
                   "accessKeyId", "secretAccessKey", "pg_restore"):
        assert needed in text, needed
    blocks = re.findall(r"```json\n(.*?)```", text, re.DOTALL)
    settings = S3_SETTINGS["s3"]
    assert least_privilege_policy(settings["bucket"], settings["prefix"]) in [
        json.loads(b.replace("<bucket>", settings["bucket"]).replace("<prefix>", settings["prefix"])) for b in blocks]
    link = (Path(__file__).resolve().parent.parent / "docs" / "cloudstate.md").read_text()
    assert "backups.md" in link
