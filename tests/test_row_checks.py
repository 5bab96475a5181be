"""The row checks of keel.tasks and keel.task_events (migration 0048): each table's rules
in one function its one check constraint calls. Every rule the 20 constraints held is
still refused, by any writer (here a superuser writing the table directly, which no
function guards), with check_violation (23514) and the old constraint's name, table and
column in the error; a valid row and the NULLs a check lets through still pass. On one
node and on the Citus cluster, where the rows are written on the workers' shards.

Mutations that fail it: a rule dropped from keel.check_task_row or
keel.check_task_event_row (its case is then stored), a rule that refuses NULL (the
null-columns case), a refusal naming another constraint."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import errors, sql

import citus_cluster
from agentkeel.client import Keel

TRACE = "0af7651916cd43dd8448eb211c80319c"
SPAN = "b7ad6b7169203331"

TASK_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("state", {"state": "Queued"}, "tasks_state_check"),
    ("state", {"state": "q" * 64}, "tasks_state_check"),
    ("state_version", {"state_version": 0}, "tasks_state_version_check"),
    ("last_event_seq", {"last_event_seq": -1}, "tasks_last_event_seq_check"),
    ("current_step", {"current_step": ""}, "tasks_current_step_check"),
    ("current_step", {"current_step": "s" * 201}, "tasks_current_step_check"),
    ("fencing_token", {"fencing_token": -1}, "tasks_fencing_token_check"),
    ("lease_owner", {"lease_owner": ""}, "tasks_lease_owner_check"),
    ("lease_owner", {"lease_owner": None}, "tasks_lease_complete_check"),
    ("lease_owner", {"lease_acquired_at": None}, "tasks_lease_complete_check"),
    ("trace_id", {"trace_id": "0" * 32}, "tasks_trace_id_check"),
    ("trace_id", {"trace_id": TRACE.upper()}, "tasks_trace_id_check"),
    ("span_id", {"span_id": "0" * 16}, "tasks_span_id_check"),
    ("span_id", {"span_id": SPAN + "0"}, "tasks_span_id_check"),
    ("metadata", {"metadata": "[]"}, "tasks_metadata_check"),
    ("recovery_attempts", {"recovery_attempts": -1}, "tasks_recovery_attempts_check"),
]

EVENT_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("seq", {"seq": 0}, "task_events_seq_check"),
    ("event_type", {"event_type": "1moved"}, "task_events_event_type_check"),
    ("event_type", {"event_type": "m" * 64}, "task_events_event_type_check"),
    ("actor", {"actor": ""}, "task_events_actor_check"),
    ("claimed_actor", {"claimed_actor": "a" * 201}, "task_events_claimed_actor_check"),
    ("policy_version", {"policy_version": "p" * 101}, "task_events_policy_version_check"),
    ("payload", {"payload": '"text"'}, "task_events_payload_check"),
    ("trace_id", {"trace_id": TRACE[:31]}, "task_events_trace_id_check"),
    ("span_id", {"span_id": SPAN.upper()}, "task_events_span_id_check"),
]


@pytest.fixture(scope="module")
def citus_rows_db(citus_admin_dsn: str) -> Iterator[str]:
    """One migrated and distributed database on the cluster for the module's cases (each
    has a tenant of its own): a fresh one per case took 15 s."""
    with citus_cluster.fresh_database(citus_admin_dsn) as dsn:
        citus_cluster.migrate_and_distribute(dsn)
        yield dsn


@pytest.fixture(params=["migrated_db", "citus_rows_db"], ids=["postgres", "citus"])
def keel_db(request: pytest.FixtureRequest) -> Iterator[tuple[str, uuid.UUID, uuid.UUID]]:
    """A migrated database (distributed, on the cluster) with a tenant and one of its
    tasks: (superuser DSN, tenant, task)."""
    request.node.on_citus = request.param == "citus_rows_db"
    dsn: str = request.getfixturevalue(request.param)
    task = uuid.uuid4()
    with psycopg.connect(dsn, autocommit=True) as conn:
        keel = Keel(conn)
        if not conn.execute("select 1 from keel.workflows where workflow = 'rows'").fetchone():
            keel.define_workflow("rows", 1, "queued", [("queued", "done")])
        tenant = keel.create_tenant("rows").tenant_id
        conn.execute(
            "insert into keel.tasks (tenant_id, task_id, workflow, workflow_version, state)"
            " values (%s, %s, 'rows', 1, 'queued')",
            (tenant, task),
        )
    yield dsn, tenant, task


def task_row(tenant: uuid.UUID, **changes: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "tenant_id": tenant,
        "task_id": uuid.uuid4(),
        "workflow": "rows",
        "workflow_version": 1,
        "state": "queued",
        "state_version": 1,
        "last_event_seq": 0,
        "current_step": "plan",
        "fencing_token": 3,
        "lease_owner": "worker-1",
        "lease_acquired_at": "2026-01-01T00:00:00Z",
        "lease_expires_at": "2026-01-01T00:01:00Z",
        "trace_id": TRACE,
        "span_id": SPAN,
        "metadata": "{}",
        "recovery_attempts": 0,
    }
    row.update(changes)
    return row


def event_row(tenant: uuid.UUID, task: uuid.UUID, **changes: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "tenant_id": tenant,
        "task_id": task,
        "seq": 1,
        "event_type": "created",
        "to_state": "queued",
        "state_version": 1,
        "actor": "tests",
        "claimed_actor": "someone",
        "policy_version": "v1",
        "payload": "{}",
        "trace_id": TRACE,
        "span_id": SPAN,
    }
    row.update(changes)
    return row


def insert(conn: psycopg.Connection, table: str, row: dict[str, Any]) -> None:
    conn.execute(
        sql.SQL("insert into keel.{} ({}) values ({})").format(
            sql.Identifier(table),
            sql.SQL(", ").join(map(sql.Identifier, row)),
            sql.SQL(", ").join(sql.Placeholder() * len(row)),
        ),
        list(row.values()),
    )


# A worker's error reaches a Citus coordinator's client with its SQLSTATE, message,
# detail and hint only (the schema, table, column and constraint fields are not relayed,
# for a native check constraint either): there the message names the rule.
ON_CITUS = (None, None, None, None)


def named(err: psycopg.Error) -> tuple[str | None, ...]:
    d = err.diag
    return (d.schema_name, d.table_name, d.column_name, d.constraint_name)


def fields(request: pytest.FixtureRequest, table: str, column: str, constraint: str) -> tuple:
    """The error fields expected: all four on one node, none through a Citus coordinator."""
    return ON_CITUS if request.node.on_citus else ("keel", table, column, constraint)


def refused(dsn: str, table: str, row: dict[str, Any]) -> errors.CheckViolation:
    with (
        psycopg.connect(dsn, autocommit=True) as conn,
        pytest.raises(errors.CheckViolation) as caught,
    ):
        insert(conn, table, row)
    return caught.value


@pytest.mark.parametrize(("column", "changes", "constraint"), TASK_CASES)
def test_a_task_row_breaking_a_rule_is_refused_with_its_name(
    request, keel_db, column, changes, constraint
):
    dsn, tenant, _ = keel_db
    err = refused(dsn, "tasks", task_row(tenant, **changes))
    assert f'new row for relation "tasks" violates check constraint "{constraint}"' in str(err)
    assert named(err) == fields(request, "tasks", column, constraint)


@pytest.mark.parametrize(("column", "changes", "constraint"), EVENT_CASES)
def test_an_event_row_breaking_a_rule_is_refused_with_its_name(
    request, keel_db, column, changes, constraint
):
    dsn, tenant, task = keel_db
    err = refused(dsn, "task_events", event_row(tenant, task, **changes))
    assert f'relation "task_events" violates check constraint "{constraint}"' in str(err)
    assert named(err) == fields(request, "task_events", column, constraint)


def test_valid_rows_and_the_nulls_a_check_lets_through_are_stored(keel_db):
    dsn, tenant, task = keel_db
    with psycopg.connect(dsn, autocommit=True) as conn:
        insert(conn, "tasks", task_row(tenant))
        insert(
            conn,
            "tasks",
            task_row(
                tenant,
                current_step=None,
                lease_owner=None,
                lease_acquired_at=None,
                lease_expires_at=None,
                trace_id=None,
                span_id=None,
            ),
        )
        insert(conn, "task_events", event_row(tenant, task))
        insert(
            conn,
            "task_events",
            event_row(
                tenant,
                task,
                seq=2,
                claimed_actor=None,
                policy_version=None,
                trace_id=None,
                span_id=None,
            ),
        )
        # An UPDATE is checked as an INSERT is.
        with pytest.raises(errors.CheckViolation) as caught:
            conn.execute(
                "update keel.tasks set state_version = 0 where tenant_id = %s and task_id = %s",
                (tenant, task),
            )
        assert 'check constraint "tasks_state_version_check"' in str(caught.value)
        stored = conn.execute(
            "select (select count(*) from keel.tasks where tenant_id = %s),"
            " (select count(*) from keel.task_events where tenant_id = %s)",
            (tenant, tenant),
        ).fetchone()
    assert stored == (3, 2)  # the fixture's task and the two tasks and two events here
