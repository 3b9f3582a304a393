"""A CloudState store: its database (components/postgres.py or components/cassandra.py) and the
`StatefulStore` custom resource that points CloudState at it, with the credentials read from
the database's Secret (never literal values)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

from components import cloudstate_crds as crds
from components import k8s as kb
from components.cassandra import Cassandra, CassandraArgs, CassandraSettings
from components.kept_secret import Cluster
from components.model import ConfigModel
from components.postgres import Postgres, PostgresArgs, PostgresSettings
from components.postgres_backup import BackupSettings, backup_for
from components.component import Component

StoreKind = Literal["postgres", "cassandra"]


class StoresConfig(ConfigModel):
    """How the stores of CloudState entities run (stack key `cloudstation:platform.stores`).
    managed: one server per project namespace; external: one shared server, one database
    (Postgres) or keyspace (Cassandra) per project and environment."""

    postgres: PostgresSettings = PostgresSettings()
    cassandra: CassandraSettings = CassandraSettings()
    backups: BackupSettings = BackupSettings()
    """Scheduled backups of every managed PostgreSQL store of the stack, Armada's included
    (components/postgres_backup.py, docs/backups.md)."""


@dataclass(frozen=True)
class CloudStateStoreArgs:
    kind: StoreKind
    stores: StoresConfig
    namespace: pulumi.Input[str]
    namespace_name: str
    database: str
    """Postgres: the database of this store's journal (its own on a shared external server)."""
    depends_on: Sequence[pulumi.Resource] = ()
    """The CloudState CRDs and operator (when this stack owns them)."""
    image_mirror: Optional[str] = None
    cluster: Optional[Cluster] = Cluster()
    """Where a managed store's kept credentials Secret is read back (components/kept_secret.py)."""


# --- pure builders ---------------------------------------------------------------------------


def stateful_store_spec(kind: StoreKind, host: str, port: int, secret: str) -> dict:
    """The v0.5 (Scala operator) StatefulStore spec. Secret keys are spelled out: the operator
    ignores `credentialsFromSecret` for optional parameters unless their key is named (v0.6.0
    `operator/src/main/scala/io/cloudstate/operator/stores/CredentialsHelper.scala`), and
    Cassandra's username and password are both optional there (`CassandraStoreSupport.scala`);
    explicit is clearer for Postgres' mandatory ones too. Operator 0.6.0 passes each key to the
    proxy as a secretKeyRef (`POSTGRES_*`, `CASSANDRA_USERNAME`/`CASSANDRA_PASSWORD`), which the
    0.5.1 proxies read."""
    if kind == "postgres":
        config = {
            "service": host,
            "port": port,
            "credentialsFromSecret": {
                "name": secret,
                "databaseKey": "database",
                "usernameKey": "username",
                "passwordKey": "password",
            },
        }
        return {"type": "Postgres", "deployment": "Unmanaged", "config": config}
    config = {"service": host, "credentialsFromSecret": {"name": secret, "usernameKey": "username", "passwordKey": "password"}}
    return {"type": "Cassandra", "deployment": "Unmanaged", "config": config}


# --- component -------------------------------------------------------------------------------


class CloudStateStore(Component):
    """Outputs: `store_name` (the StatefulStore's name, for `datastore.name`), `kind`,
    `ready` (the database and the StatefulStore, for depends_on)."""

    def __init__(self, name: str, args: CloudStateStoreArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("cloudstation:cloudstate:Store", name, None, opts)
        child = self.child_opts()
        self.kind = args.kind
        if args.kind == "postgres":
            database: Postgres | Cassandra = Postgres(
                name,
                PostgresArgs(
                    settings=args.stores.postgres,
                    namespace=args.namespace,
                    database=args.database,
                    image_mirror=args.image_mirror,
                    cluster=args.cluster,
                ),
                child,
            )
        else:
            database = Cassandra(
                name,
                CassandraArgs(
                    settings=args.stores.cassandra,
                    namespace=args.namespace,
                    namespace_name=args.namespace_name,
                    image_mirror=args.image_mirror,
                    cluster=args.cluster,
                ),
                child,
            )
        if isinstance(database, Postgres):
            backup_for(database, args.stores.backups, args.namespace, args.namespace_name, args.image_mirror, child)
        self.store_name = name
        self.endpoint = database.endpoint
        store = k8s.apiextensions.CustomResource(
            f"{name}-statefulstore",
            api_version=crds.API_VERSION,
            kind="StatefulStore",
            metadata=kb.metadata(name, args.namespace, "cloudstate-store"),
            spec=pulumi.Output.all(database.host, database.secret_name).apply(
                lambda values: stateful_store_spec(args.kind, values[0], database.port, values[1])
            ),
            opts=self.child_opts(depends_on=[*args.depends_on, *database.ready]),
        )
        self.ready: list[pulumi.Resource] = [*database.ready, store]
        self.register_outputs({"storeName": self.store_name, "host": database.host})
