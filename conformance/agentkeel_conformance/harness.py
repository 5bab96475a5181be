"""Helpers the tests share: snapshots of a tenant's rows, and racing calls on many connections."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, NoReturn, TypeVar

import psycopg
import pytest
from psycopg import sql

from agentkeel.client import set_tenant_context

T = TypeVar("T")


def dsn_env(dsn: str, drop: Sequence[str] = ()) -> dict[str, str]:
    """The environment for an agentkeel subprocess: its DSN (a temporary login's, with the
    password) goes in $AGENTKEEL_DSN, never on the command line, where a failure report or
    `ps` would show it."""
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["AGENTKEEL_DSN"] = dsn
    return env


def tenant_tables(conn: psycopg.Connection) -> list[str]:
    """The tenant tables as the database defines them (keel.tenant_tables(), the list row-level
    security is forced on), qualified: the suite never keeps a list of its own."""
    return [str(row[0]) for row in conn.execute("select keel.tenant_tables()::text")]


@contextmanager
def in_tenant(conn: psycopg.Connection, tenant_id: uuid.UUID) -> Iterator[psycopg.Connection]:
    """A transaction whose tenant context is tenant_id: how the suite reads raw rows, so it
    works for a non-superuser owner too (row-level security is forced on the owner)."""
    with conn.transaction():
        set_tenant_context(conn, tenant_id)
        yield conn


# Every tenant this process made and has not removed yet, listed before it exists: what a
# Ctrl-C leaves behind in the middle of a test (between a commit and its listing, or inside
# a cleanup) is removed at the end of the session (fixtures.live_tenants).
LIVE_TENANTS: set[uuid.UUID] = set()


def suite_tenant(tenant_id: uuid.UUID) -> uuid.UUID:
    """List a tenant the suite is about to make, for removal at the end at the latest."""
    LIVE_TENANTS.add(tenant_id)
    return tenant_id


def delete_tenant(owner: psycopg.Connection, tenant_id: uuid.UUID) -> None:
    """Remove a tenant the suite made and, by cascade, everything it owns; its events go
    through a purge (G4); and the record and tombstones of its deletion, if a G10 test
    deleted it (the suite leaves nothing behind). Owner only, and test support only: a raw
    DELETE is quicker than keel.delete_tenant, which the G10 tests prove."""
    with in_tenant(owner, tenant_id):
        owner.execute("set local keel.purge = on")
        owner.execute("delete from keel.tenants where tenant_id = %s", (tenant_id,))
        deleted = owner.execute(
            "select 1 from keel.tenant_deletions where deleted_tenant_id = %s", (tenant_id,)
        ).fetchone()
        if deleted:  # only then: on Citus a write to a reference table reaches every node
            owner.execute(
                "delete from keel.task_event_tombstones where deleted_tenant_id = %s",
                (tenant_id,),
            )
            owner.execute(
                "delete from keel.tenant_deletions where deleted_tenant_id = %s", (tenant_id,)
            )
    LIVE_TENANTS.discard(tenant_id)


def tenant_snapshot(
    conn: psycopg.Connection, tenant_id: uuid.UUID
) -> dict[str, list[tuple[Any, ...]]]:
    """Every row the tenant owns, table by table, in a stable order: compare two to prove
    that a refused call wrote nothing."""
    snapshot: dict[str, list[tuple[Any, ...]]] = {}
    with in_tenant(conn, tenant_id):
        for table in tenant_tables(conn):
            query = sql.SQL(
                "select to_jsonb(t)::text from {} as t where t.tenant_id = %s order by 1"
            ).format(sql.Identifier(*table.split(".")))
            snapshot[table] = conn.execute(query, (tenant_id,)).fetchall()
    # An empty view would make every comparison pass: the tenant must be visible.
    assert snapshot["keel.tenants"], "the tenant's own rows are not visible to the suite"
    return snapshot


def race(calls: Sequence[Callable[[], Any]], timeout: float = 60) -> list[tuple[str, Any]]:
    """Start every call at the same instant (one thread each, a barrier between them) and
    return ("ok", value) or ("error", exception) per call, in order."""
    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[], Any]) -> tuple[str, Any]:
        barrier.wait(timeout)
        try:
            return ("ok", call())
        except Exception as exc:
            return ("error", exc)

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        futures = [pool.submit(run, call) for call in calls]
        return [f.result(timeout) for f in futures]


def wait_for(probe: Callable[[], T | None], what: str, timeout: float = 120.0) -> T:
    """Poll probe until it returns something (not None, not False) and return that: a wait
    on a condition, not on the machine's speed. The deadline is generous, so a slow machine
    waits longer rather than failing; past it, AssertionError names what never happened."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:g}s for {what}")
        time.sleep(0.02)


# The prefix of a skip that means the experiment could not be set up, not that the
# guarantee was missing (the plugin prints such a test as INCONCLUSIVE).
INCONCLUSIVE = "inconclusive: "


def inconclusive(reason: str) -> NoReturn:
    """Stop a test whose experiment could not be set up (after its retries): a skip saying
    why, never a guarantee failure. The guarantee then reads partial."""
    pytest.skip(INCONCLUSIVE + reason)
