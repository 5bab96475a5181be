"""A real Citus cluster for the project's tests: fresh databases on every node of it.

Point $AGENTKEEL_CITUS_DSN at a coordinator's superuser DSN (``../shared/citus/cluster.sh
dsn`` prints one); the tests that need Citus skip with that reason when it is unset. Each
database a test asks for is made on every node (Citus keeps its metadata per database),
with the extension and the same nodes as the cluster's own database, and dropped
afterwards. Roles are per node and shared by every database, as on any server: migrating
creates the keel_* group roles once, under a lock, since test processes share the cluster.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import conninfo, sql

from agentkeel.distribute import apply, plan, read_layout
from agentkeel.migrate import migrate_up
from agentkeel.sql_files import sql_root

ENV = "AGENTKEEL_CITUS_DSN"
SKIP_REASON = (
    f"no Citus cluster: set ${ENV} to a coordinator's superuser DSN "
    "(../shared/citus/cluster.sh start, then cluster.sh dsn)"
)


@dataclass(frozen=True)
class Node:
    host: str
    port: int
    group: int  # 0: the coordinator


def admin_dsn() -> str:
    dsn = os.environ.get(ENV)
    if not dsn:
        pytest.skip(SKIP_REASON)
    return dsn


def nodes(dsn: str) -> list[Node]:
    """The cluster's nodes as its own database knows them, coordinator first."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "select nodename, nodeport, groupid from pg_dist_node"
            " where isactive and noderole = 'primary' order by groupid"
        ).fetchall()
    return [Node(h, p, g) for h, p, g in rows]


def node_dsn(dsn: str, node: Node, dbname: str) -> str:
    return conninfo.make_conninfo(dsn, host=node.host, port=str(node.port), dbname=dbname)


@contextlib.contextmanager
def cluster_lock(dsn: str) -> Iterator[None]:
    """One test process at a time creates cluster-wide things (the keel_* roles)."""
    key = uuid.uuid5(uuid.NAMESPACE_URL, dsn).hex[:12]
    path = Path(tempfile.gettempdir()) / f"agentkeel-citus-{key}.lock"
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def fresh_database(dsn: str) -> Iterator[str]:
    """A new database on every node, Citus installed and the nodes added; yields the
    coordinator's superuser DSN for it, and drops it everywhere afterwards."""
    cluster = nodes(dsn)
    name = f"akc_citus_{uuid.uuid4().hex[:10]}"
    made: list[Node] = []
    try:
        for node in cluster:
            with psycopg.connect(node_dsn(dsn, node, "postgres"), autocommit=True) as conn:
                conn.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
            made.append(node)
            with psycopg.connect(node_dsn(dsn, node, name), autocommit=True) as conn:
                conn.execute("create extension citus")
        coordinator, workers = cluster[0], cluster[1:]
        target = node_dsn(dsn, coordinator, name)
        with psycopg.connect(target, autocommit=True) as conn:
            conn.execute(
                "select citus_set_coordinator_host(%s, %s)", (coordinator.host, coordinator.port)
            )
            for worker in workers:
                add_node(conn, worker)
        yield target
    finally:
        for node in made:
            with psycopg.connect(node_dsn(dsn, node, "postgres"), autocommit=True) as conn:
                conn.execute(
                    sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name))
                )


def add_node(conn: psycopg.Connection, worker: Node) -> None:
    """citus_add_node, tried again while it fails with "failure on connection marked as
    essential": adding a node copies every role onto it, and another test process that
    creates or drops its roles on that worker at the same moment makes the copy fail. The
    failed call adds nothing."""
    for attempt in range(10):
        try:
            conn.execute("select citus_add_node(%s, %s)", (worker.host, worker.port))
            return
        except psycopg.errors.InternalError_ as error:
            if "marked as essential" not in str(error) or attempt == 9:
                raise
            time.sleep(0.5)


def drop_roles(dsn: str, names: list[str]) -> None:
    """Drop login roles on every node. Roles are per node; Citus propagates a DROP ROLE
    only from a database whose metadata knows the role, and the one that did may be gone."""
    for node in nodes(dsn):
        with psycopg.connect(node_dsn(dsn, node, "postgres"), autocommit=True) as conn:
            for name in names:
                conn.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(name)))


def migrate_and_distribute(dsn: str) -> None:
    """`agentkeel migrate up` then `agentkeel distribute --apply`, as a superuser."""
    with cluster_lock(dsn), psycopg.connect(dsn, autocommit=True) as conn:
        migrate_up(conn, sql_root())
        apply(conn, plan(read_layout(conn)))


def on_workers(dsn: str, query: str) -> list[tuple[bool, str]]:
    """run_command_on_workers: (success, result) per worker."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [
            (bool(ok), str(result))
            for ok, result in conn.execute(
                "select success, result from run_command_on_workers(%s)", (query,)
            )
        ]
