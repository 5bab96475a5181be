"""G4 Append-only history: no application role can change or remove events, and the
owner is refused too, except through a purge."""

from __future__ import annotations

import psycopg
import pytest

from agentkeel.client import set_tenant_context
from agentkeel_conformance.connections import suite_connect
from agentkeel_conformance.harness import in_tenant

pytestmark = pytest.mark.guarantee("G4")

ROLES = ("keel_app", "keel_worker", "keel_agent", "keel_relay", "keel_auditor")
CHANGES = {
    "update": "update keel.task_events set payload = '{}' where tenant_id = %s",
    "delete": "delete from keel.task_events where tenant_id = %s",
    "truncate": "truncate keel.task_events",
}


@pytest.fixture
def history(keel, tenant, new_task):
    task = new_task()
    keel.transition_task(tenant, task.task_id, 1, "running", payload={"n": 1})
    return task


@pytest.mark.parametrize("change", sorted(CHANGES))
@pytest.mark.parametrize("role", ROLES)
def test_no_application_role_can_change_events(login_role, tenant, history, connect, role, change):
    """No mutation: privileges refuse before the trigger; no planted bug grants DML."""
    with suite_connect(login_role(role).dsn) as conn:
        set_tenant_context(conn, tenant)
        params = (tenant,) if "%s" in CHANGES[change] else None
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(CHANGES[change], params)


@pytest.mark.parametrize("change", ["update", "delete"])
def test_the_owner_is_refused_too(connect, tenant, history, change):
    """Mutation: trigger_open."""
    conn = connect(owner=True)
    with pytest.raises(psycopg.Error) as info, in_tenant(conn, tenant):
        conn.execute(CHANGES[change], (tenant,))
    assert info.value.sqlstate == "55K07"
    assert "append-only" in str(info.value)


def test_the_owner_cannot_truncate_events(connect, tenant, history):
    """Mutation: truncate_open."""
    conn = connect(owner=True)
    # Rolled back whatever happens: where the trigger lets TRUNCATE through, every tenant's
    # history would be gone. TRUNCATE locks the table before its trigger runs: briefly.
    with pytest.raises(psycopg.Error) as info, conn.transaction(force_rollback=True):
        conn.execute("set local lock_timeout = '2s'")
        conn.execute("truncate keel.task_events")
    if info.value.sqlstate == "55P03":
        pytest.skip("keel.task_events is busy: TRUNCATE could not take its lock within 2 s")
    assert info.value.sqlstate == "55K07", info.value
    assert "append-only: TRUNCATE refused" in str(info.value)


def test_a_purge_may_delete_but_never_update(connect, tenant, history):
    """Mutation: trigger_open."""
    conn = connect(owner=True)
    with conn.transaction(force_rollback=True):
        set_tenant_context(conn, tenant)
        conn.execute("set local keel.purge = on")
        deleted = conn.execute(
            "delete from keel.task_events where tenant_id = %s", (tenant,)
        ).rowcount
        assert deleted == 2
    with pytest.raises(psycopg.Error) as info, in_tenant(conn, tenant):
        conn.execute("set local keel.purge = on")
        conn.execute(CHANGES["update"], (tenant,))
    assert info.value.sqlstate == "55K07"


@pytest.mark.parametrize("trigger", ["task_events_append_only", "task_events_append_only_truncate"])
def test_the_append_only_triggers_are_installed_and_enabled(connect, trigger):
    """No mutation: a catalog property checked directly (pg_trigger)."""
    row = (
        connect()
        .execute(
            "select tgenabled from pg_trigger"
            " where tgrelid = 'keel.task_events'::regclass and tgname = %s",
            (trigger,),
        )
        .fetchone()
    )
    assert row == ("O",), f"the append-only trigger {trigger} is missing or disabled"


def test_the_auditor_reads_every_tenants_history(login_role, make_tenant, keel, workflow):
    """No mutation: the auditor's grant and policy have no planted bug yet."""
    tenants = [make_tenant(), make_tenant()]
    for t in tenants:
        keel.create_task(t, workflow.name, workflow.version)
    with suite_connect(login_role("keel_auditor").dsn) as conn:
        seen = {
            r[0]
            for r in conn.execute(
                "select tenant_id from keel.task_events where tenant_id = any(%s)", (tenants,)
            )
        }
    assert seen == set(tenants)
