"""A caller's search_path reaches no keel code (G1). The internal helpers do not pin their
own (each SET clause costs a call a GUC save and restore): they are granted to no role, so
they run only inside the SECURITY DEFINER functions, in the search_path those pin. A login
that puts a schema of its own before pg_catalog, with functions that shadow the built-ins
the helpers call, still gets keel's checks and writes, never its own code; and the same
login does hijack a definer function whose pin is removed (the control)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from agentkeel.client import Keel
from agentkeel.errors import PayloadRejected
from conftest import temporary_login

# Built-ins the helpers of the claim, the transition and the reservation call unqualified.
SHADOWED = (
    ("jsonb_typeof", "jsonb", "text"),
    ("jsonb_array_length", "jsonb", "integer"),
    ("char_length", "text", "integer"),
    ("octet_length", "text", "integer"),
    ("clock_timestamp", "", "timestamptz"),
)
TRANSITION = (
    "keel.transition_task(uuid, uuid, bigint, text, bigint, text, jsonb, jsonb, text, text,"
    " text, boolean, timestamptz)"
)


@pytest.fixture
def hostile(migrated_db: str) -> Iterator[tuple[str, str]]:
    """A worker login whose search_path starts with a schema of shadowing functions, each
    raising 'hijacked'; yields its DSN and the schema."""
    schema = f"hostile_{uuid.uuid4().hex[:8]}"
    with temporary_login(migrated_db, "keel_worker") as dsn:
        with psycopg.connect(migrated_db, autocommit=True) as su:
            su.execute(sql.SQL("create schema {}").format(sql.Identifier(schema)))
            for name, args, result in SHADOWED:
                su.execute(
                    sql.SQL(
                        "create function {}.{}({}) returns {} language plpgsql as"
                        " $$ begin raise exception 'hijacked by %', {}; end $$"
                    ).format(
                        sql.Identifier(schema),
                        sql.Identifier(name),
                        sql.SQL(args),
                        sql.SQL(result),
                        sql.Literal(name),
                    )
                )
            su.execute(sql.SQL("grant usage on schema {} to public").format(sql.Identifier(schema)))
        try:
            yield dsn, schema
        finally:
            with psycopg.connect(migrated_db, autocommit=True) as su:
                su.execute(
                    sql.SQL("drop schema if exists {} cascade").format(sql.Identifier(schema))
                )


def _world(dsn: str) -> tuple[uuid.UUID, str]:
    workflow = f"sp-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as su:
        keel = Keel(su)
        keel.define_workflow(workflow, 1, "queued", [("queued", "running"), ("running", "done")])
        return keel.create_tenant("search-path").tenant_id, workflow


def _connect(dsn: str, schema: str) -> psycopg.Connection:
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(sql.SQL("set search_path = {}, pg_catalog").format(sql.Identifier(schema)))
    return conn


def test_a_shadowing_search_path_reaches_no_helper(migrated_db, hostile):
    dsn, schema = hostile
    tenant, workflow = _world(migrated_db)
    with _connect(dsn, schema) as conn:
        # The login's own calls do resolve to its functions: the shadow is in effect.
        with pytest.raises(psycopg.errors.RaiseException, match="hijacked by jsonb_typeof"):
            conn.execute("select jsonb_typeof('{}'::jsonb)")
        keel = Keel(conn)
        task = keel.create_task(tenant, workflow, 1)
        claimed = keel.claim_next_task("sp-worker", workflow=workflow)
        assert claimed is not None and claimed.task_id == task.task_id
        moved = keel.transition_task(
            tenant,
            task.task_id,
            claimed.state_version,
            "running",
            fencing_token=claimed.fencing_token,
            payload={"step": "one"},
            outbox=[{"topic": "sp.moved", "key": "k", "payload": {"n": 1}}],
        )
        assert moved.state == "running"
        # The payload check still refuses what it refuses (its size: octet_length).
        with pytest.raises(PayloadRejected):
            keel.transition_task(
                tenant,
                task.task_id,
                moved.state_version,
                "done",
                fencing_token=claimed.fencing_token,
                payload={"blob": "x" * 70_000},
            )
        reserved = keel.reserve_operation(tenant, None, "sp-key", "act", "h1")
        again = keel.reserve_operation(tenant, None, "sp-key", "act", "h1")
        assert (reserved.outcome, again.outcome) == ("reserved", "in_progress")


def test_a_definer_function_without_its_pin_is_hijacked(migrated_db, hostile):
    """The control: the same login reaches its shadowing functions through a definer
    function whose search_path is no longer pinned (its own jsonb_typeof, first)."""
    dsn, schema = hostile
    tenant, workflow = _world(migrated_db)
    with psycopg.connect(migrated_db, autocommit=True) as su:
        su.execute(f"alter function {TRANSITION} reset search_path")
    with _connect(dsn, schema) as conn:
        keel = Keel(conn)
        task = keel.create_task(tenant, workflow, 1)
        with pytest.raises(psycopg.errors.RaiseException, match="hijacked"):
            keel.transition_task(tenant, task.task_id, task.state_version, "running")
