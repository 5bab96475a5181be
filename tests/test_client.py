"""The Python client: tenant context per transaction, typed results, mapped errors."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from agentkeel.client import Keel
from agentkeel.errors import TaskNotFound, UnknownTenant, UnknownWorkflow, WorkflowConflict

EDGES = [("queued", "running"), ("running", "done")]


@pytest.fixture
def keel(migrated_db):
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        yield Keel(conn)


def test_the_tenant_context_lasts_one_transaction(keel):
    tenant = keel.create_tenant("t").tenant_id
    with keel.transaction(tenant) as conn:
        assert conn.execute("select current_setting('keel.tenant_id')").fetchone()[0] == str(tenant)
    after = keel.conn.execute("select current_setting('keel.tenant_id', true)").fetchone()[0]
    assert after in (None, "")


def test_the_context_does_not_survive_an_error(keel):
    tenant = keel.create_tenant("t").tenant_id
    with pytest.raises(TaskNotFound):
        keel.claim_lease(tenant, uuid.uuid4(), "w")
    after = keel.conn.execute("select current_setting('keel.tenant_id', true)").fetchone()[0]
    assert after in (None, "")


def test_calls_inside_a_caller_transaction_commit_or_roll_back_with_it(keel):
    keel.define_workflow("wf", 1, "queued", EDGES)
    tenant = keel.create_tenant("t").tenant_id
    with pytest.raises(RuntimeError), keel.conn.transaction():
        task = keel.create_task(tenant, "wf", 1)
        raise RuntimeError("abort")
    assert keel.get_task(tenant, task.task_id) is None


def test_workflow_definitions_are_idempotent_and_immutable(keel):
    assert keel.define_workflow("wf", 1, "queued", EDGES) is True
    assert keel.define_workflow("wf", 1, "queued", list(reversed(EDGES))) is False
    with pytest.raises(WorkflowConflict):
        keel.define_workflow("wf", 1, "queued", [*EDGES, ("running", "failed")])
    with pytest.raises(WorkflowConflict):
        keel.define_workflow("wf", 1, "running", EDGES)


def test_unknown_references_raise_their_own_errors(keel):
    tenant = keel.create_tenant("t").tenant_id
    with pytest.raises(UnknownTenant):
        keel.create_task(uuid.uuid4(), "wf", 1)
    with pytest.raises(UnknownWorkflow):
        keel.create_task(tenant, "nope", 1)


def test_task_ids_are_time_ordered_uuid_v7(keel):
    keel.define_workflow("wf", 1, "queued", EDGES)
    tenant = keel.create_tenant("t").tenant_id
    ids = [keel.create_task(tenant, "wf", 1).task_id for _ in range(20)]
    assert all(i.version == 7 for i in ids)
    millis = [i.int >> 80 for i in ids]  # the 48-bit Unix-millisecond prefix
    assert millis == sorted(millis)


def test_trace_context_is_validated(keel):
    keel.define_workflow("wf", 1, "queued", EDGES)
    tenant = keel.create_tenant("t").tenant_id
    task = keel.create_task(
        tenant, "wf", 1, trace_id="4bf92f3577b34da6a3ce929d0e0e4736", span_id="00f067aa0ba902b7"
    )
    assert keel.task_events(tenant, task.task_id)[0].trace_id == task.trace_id
    with pytest.raises(psycopg.errors.CheckViolation):
        keel.create_task(tenant, "wf", 1, trace_id="not-a-trace-id")
