"""G1 Tenant isolation, attacked from real login roles.

An agent login (member of keel_agent) holding a valid token for tenant A runs arbitrary
SQL: no statement may reveal or change a row of tenant B. An app login (keel_app) is
trusted with a plain context, but still writes only through the guarded functions.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from agentkeel.client import Keel, Task, set_tenant_context
from agentkeel.errors import (
    InvalidTenantToken,
    TaskNotFound,
    TenantContextMismatch,
    TenantContextMissing,
)
from agentkeel_conformance.fixtures import CONNECTION_OPTIONS

pytestmark = pytest.mark.guarantee("G1")

TENANT_TABLES = ("tenants", "tasks", "task_events", "operations", "outbox")
AGENT_READABLE = ("tasks", "task_events", "operations")


@dataclass(frozen=True)
class Side:
    tenant: uuid.UUID
    task: Task
    operation_id: uuid.UUID
    token: str


@dataclass(frozen=True)
class World:
    a: Side
    b: Side
    agent_dsn: str
    app_dsn: str


def _populate(keel: Keel, tenant: uuid.UUID, workflow: Any, key: str) -> Side:
    task = keel.create_task(
        tenant, workflow.name, workflow.version, metadata={"secret_of": str(tenant)}
    )
    claimed = keel.claim_lease(tenant, task.task_id, "setup", timedelta(minutes=10))
    op = keel.reserve_operation(
        tenant, task.task_id, key, "charge", "h", fencing_token=claimed.fencing_token
    )
    moved = keel.transition_task(
        tenant,
        task.task_id,
        1,
        "running",
        fencing_token=claimed.fencing_token,
        payload={"note": f"event of {tenant}"},
        outbox=[{"topic": "t", "payload": {"of": str(tenant)}}],
    )
    return Side(tenant, moved, op.operation_id, keel.mint_tenant_token(tenant))


@pytest.fixture
def world(keel, make_tenant, workflow, login_role) -> World:
    agent, app = login_role("keel_agent"), login_role("keel_app")
    a = _populate(keel, make_tenant(), workflow, "key-of-a")
    b = _populate(keel, make_tenant(), workflow, "key-of-b")
    return World(a, b, agent.dsn, app.dsn)


@pytest.fixture
def agent(world: World) -> Iterator[Callable[..., list[tuple[Any, ...]]]]:
    """Run one statement as the agent login in its own transaction; token A by default."""
    conn = psycopg.connect(world.agent_dsn, autocommit=True, options=CONNECTION_OPTIONS)

    def run(
        query: str | sql.Composable,
        params: Any = None,
        *,
        token: str | None = world.a.token,
        setup: tuple[str, ...] = (),
    ) -> list[tuple[Any, ...]]:
        with conn.transaction():
            if token is not None:
                conn.execute(sql.SQL("set local keel.tenant_token = {}").format(sql.Literal(token)))
            for stmt in setup:
                conn.execute(stmt.encode())
            cur = conn.execute(query if not isinstance(query, str) else query.encode(), params)
            return cur.fetchall() if cur.description else []

    yield run
    conn.close()


def agent_keel(world: World, token: str | None) -> Keel:
    return Keel(
        psycopg.connect(world.agent_dsn, autocommit=True, options=CONNECTION_OPTIONS), token
    )


# -- reads ---------------------------------------------------------------------------


@pytest.mark.parametrize("table", AGENT_READABLE)
def test_the_agent_reads_only_its_own_tenant(world, agent, table):
    rows = agent(f"select tenant_id from keel.{table}")
    assert rows and {r[0] for r in rows} == {world.a.tenant}


@pytest.mark.parametrize("table", AGENT_READABLE)
def test_the_agent_cannot_find_the_other_tenants_rows_by_id(world, agent, table):
    assert agent(f"select * from keel.{table} where tenant_id = %s", (world.b.tenant,)) == []


@pytest.mark.parametrize(
    "table", ["tenants", "outbox", "tenant_token_keys", "settings", "migration_history"]
)
def test_the_agent_cannot_read_tables_it_was_not_granted(agent, table):
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        agent(f"select * from keel.{table}")


def test_without_a_token_the_agent_sees_nothing(agent):
    for table in AGENT_READABLE:
        assert agent(f"select * from keel.{table}", token=None) == []


def test_a_plain_tenant_id_is_ignored_for_the_agent(world, agent):
    setup = (f"set local keel.tenant_id = '{world.b.tenant}'",)
    assert agent("select * from keel.tasks", token=None, setup=setup) == []
    rows = agent("select tenant_id from keel.tasks", setup=setup)
    assert {r[0] for r in rows} == {world.a.tenant}


def test_set_config_does_not_switch_the_agents_tenant(world, agent):
    setup = (f"select set_config('keel.tenant_id', '{world.b.tenant}', false)",)
    rows = agent("select tenant_id from keel.tasks", setup=setup)
    assert {r[0] for r in rows} == {world.a.tenant}


@pytest.mark.parametrize(
    "statement",
    ["copy keel.tasks (tenant_id) to stdout", "copy (select tenant_id from keel.tasks) to stdout"],
)
def test_copy_out_honours_the_tenant(world, statement):
    with psycopg.connect(world.agent_dsn, options=CONNECTION_OPTIONS) as conn:
        conn.execute(sql.SQL("set local keel.tenant_token = {}").format(sql.Literal(world.a.token)))
        with conn.cursor().copy(statement.encode()) as copy:
            data = b"".join(bytes(chunk) for chunk in copy)
    assert data.decode().split() == [str(world.a.tenant)]


def test_copy_in_is_refused(world):
    with psycopg.connect(world.agent_dsn, options=CONNECTION_OPTIONS) as conn:
        conn.execute(sql.SQL("set local keel.tenant_token = {}").format(sql.Literal(world.a.token)))
        with (
            pytest.raises(psycopg.errors.InsufficientPrivilege),
            conn.cursor().copy(b"copy keel.tasks (tenant_id) from stdin") as copy,
        ):
            copy.write_row([world.b.tenant])


def test_table_statistics_do_not_leak_other_tenants_values(world, connect, agent):
    connect(owner=True).execute("analyze keel.tasks")
    assert agent("select attname from pg_stats where schemaname = 'keel'") == []


# -- writes --------------------------------------------------------------------------

WRITES = {
    "insert": "insert into keel.{t} (tenant_id) values ('{b}')",
    "update": "update keel.{t} set tenant_id = tenant_id where tenant_id = '{b}'",
    "delete": "delete from keel.{t} where tenant_id = '{b}'",
    "truncate": "truncate keel.{t}",
}


@pytest.mark.parametrize("table", TENANT_TABLES)
@pytest.mark.parametrize("write", sorted(WRITES))
def test_the_agent_has_no_direct_writes(world, agent, table, write):
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        agent(WRITES[write].format(t=table, b=world.b.tenant))


def test_the_app_writes_only_through_the_guarded_functions(world):
    with psycopg.connect(world.app_dsn, options=CONNECTION_OPTIONS) as conn:
        set_tenant_context(conn, world.a.tenant)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(
                "update keel.tasks set state = 'done' where tenant_id = %s", (world.a.tenant,)
            )


# -- the function API ------------------------------------------------------------------

CROSS_CALLS = {
    "transition": lambda k, w: k.transition_task(
        w.b.tenant, w.b.task.task_id, 2, "done", fencing_token=1
    ),
    "reserve": lambda k, w: k.reserve_operation(
        w.b.tenant, w.b.task.task_id, "x", "x", "h", fencing_token=1
    ),
    "complete": lambda k, w: k.complete_operation(
        w.b.tenant, w.b.operation_id, 1, {"stolen": True}
    ),
    "fail": lambda k, w: k.fail_operation(w.b.tenant, w.b.operation_id, 1, {"e": 1}),
    "renew": lambda k, w: k.renew_lease(w.b.tenant, w.b.task.task_id, 1),
    "release": lambda k, w: k.release_lease(w.b.tenant, w.b.task.task_id, 1),
}


def b_state(world: World, keel: Keel) -> Any:
    return (
        keel.get_task(world.b.tenant, world.b.task.task_id),
        keel.get_operation(world.b.tenant, world.b.operation_id),
    )


@pytest.mark.parametrize("call", sorted(CROSS_CALLS))
def test_functions_refuse_another_tenants_id(world, keel, call):
    before = b_state(world, keel)
    with pytest.raises(TenantContextMismatch):
        CROSS_CALLS[call](agent_keel(world, world.a.token), world)
    assert b_state(world, keel) == before


def test_another_tenants_task_id_is_not_found_in_ones_own_tenant(world, keel):
    before = b_state(world, keel)
    with pytest.raises(TaskNotFound) as info:
        agent_keel(world, world.a.token).transition_task(
            world.a.tenant, world.b.task.task_id, 2, "done", fencing_token=1
        )
    message = f"{info.value.message} {info.value.detail} {info.value.hint}"
    assert str(world.b.tenant) not in message and "running" not in message
    assert b_state(world, keel) == before


@pytest.mark.parametrize(
    "function",
    [
        "keel.claim_next_task('x')",
        "keel.create_task(%(a)s, 'w', 1)",
        "keel.create_tenant(%(a)s, 'x')",
        "keel.mint_tenant_token(%(a)s)",
        "keel.define_workflow('w', 1, 's', '[]')",
        "keel.rotate_tenant_token_key()",
        "keel.tenant_token_signature(1, 'm')",
        "keel.claim_lease(%(a)s, %(a)s, 'x')",
    ],
)
def test_the_agent_cannot_call_functions_it_was_not_granted(world, agent, function):
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        agent(f"select {function}", {"a": world.a.tenant})


def test_a_function_call_without_a_token_fails_closed(world):
    with pytest.raises(TenantContextMissing):
        agent_keel(world, None).renew_lease(world.a.tenant, world.a.task.task_id, 1)


# -- tokens ----------------------------------------------------------------------------


def tamper(token: str, index: int, value: str) -> str:
    parts = token.split(".")
    parts[index] = value
    return ".".join(parts)


TOKEN_ATTACKS = {
    "garbage": lambda w: "not a token",
    "empty-signature": lambda w: tamper(w.a.token, 4, ""),
    "forged-signature": lambda w: tamper(w.a.token, 4, "0" * 64),
    "replayed-for-another-tenant": lambda w: tamper(w.a.token, 2, str(w.b.tenant)),
    "extended-expiry": lambda w: tamper(w.a.token, 3, str(int(w.a.token.split(".")[3]) + 3600)),
    "unknown-key-version": lambda w: tamper(w.a.token, 1, "999999"),
    "sql-in-token": lambda w: w.a.token + "'; select 1; --",
}


@pytest.mark.parametrize("attack", sorted(TOKEN_ATTACKS))
def test_altered_or_forged_tokens_are_refused(world, agent, attack):
    with pytest.raises(psycopg.Error) as info:
        agent("select * from keel.tasks", token=TOKEN_ATTACKS[attack](world))
    assert info.value.sqlstate == "42K07"
    with pytest.raises(InvalidTenantToken):
        agent_keel(world, TOKEN_ATTACKS[attack](world)).renew_lease(
            world.b.tenant, world.b.task.task_id, 1
        )


def test_an_expired_token_is_refused(world, keel, agent):
    short = keel.mint_tenant_token(world.a.tenant, timedelta(seconds=1))
    assert agent("select count(*) from keel.tasks", token=short)[0][0] >= 1
    time.sleep(2.1)
    with pytest.raises(psycopg.Error) as info:
        agent("select * from keel.tasks", token=short)
    assert info.value.sqlstate == "42K07"


def test_a_retired_key_verifies_nothing(world, keel, agent, connect, throwaway_database):
    if not throwaway_database:
        pytest.skip("retiring signing keys would invalidate live tokens: embedded cluster only")
    connect(owner=True).execute("select keel.rotate_tenant_token_key(true)")
    with pytest.raises(psycopg.Error) as info:
        agent("select * from keel.tasks", token=world.a.token)
    assert info.value.sqlstate == "42K07"
    fresh = keel.mint_tenant_token(world.a.tenant)
    assert {r[0] for r in agent("select tenant_id from keel.tasks", token=fresh)} == {
        world.a.tenant
    }


def test_the_agent_cannot_read_signing_keys_or_sign(agent):
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        agent("select inner_key from keel.tenant_token_keys")


# -- role escapes ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "escape",
    [
        "set role keel_app",
        "set role keel_owner",
        "set role keel_worker",
        "set session authorization postgres",
    ],
)
def test_the_agent_cannot_become_a_trusted_role(agent, escape):
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        agent(escape)


def test_reset_role_and_set_role_to_its_own_group_keep_it_untrusted(world, agent):
    for setup in (("reset role",), ("set local role keel_agent",)):
        plain = (*setup, f"set local keel.tenant_id = '{world.b.tenant}'")
        assert agent("select * from keel.tasks", token=None, setup=plain) == []


# -- oracles and side channels -------------------------------------------------------------


def test_idempotency_keys_are_no_existence_oracle(world, keel):
    r = keel.reserve_operation(world.a.tenant, None, "key-of-b", "charge", "different")
    assert r.outcome == "reserved"  # tenant B's key is invisible and irrelevant


def test_task_ids_are_no_existence_oracle(world, keel, workflow):
    same_id = keel.create_task(
        world.a.tenant, workflow.name, workflow.version, task_id=world.b.task.task_id
    )
    assert same_id.tenant_id == world.a.tenant


def test_advisory_locks_held_by_the_agent_do_not_block_other_tenants(world, keel, agent):
    conn = psycopg.connect(world.agent_dsn, autocommit=True, options=CONNECTION_OPTIONS)
    try:
        for key in (world.b.task.task_id.int & 0x7FFF_FFFF_FFFF_FFFF, 0, 1, 42):
            conn.execute("select pg_advisory_lock(%s)", (key,))
        keel.renew_lease(world.b.tenant, world.b.task.task_id, world.b.task.fencing_token)
        keel.transition_task(
            world.b.tenant,
            world.b.task.task_id,
            2,
            "done",
            fencing_token=world.b.task.fencing_token,
        )
    finally:
        conn.close()


def test_notifications_carry_nothing_to_the_agent(world, keel):
    with psycopg.connect(world.agent_dsn, autocommit=True, options=CONNECTION_OPTIONS) as listener:
        for channel in ("keel", "keel_tasks", "keel_outbox", "outbox", "tasks"):
            listener.execute(sql.SQL("listen {}").format(sql.Identifier(channel)))
        keel.transition_task(
            world.b.tenant,
            world.b.task.task_id,
            2,
            "done",
            fencing_token=world.b.task.fencing_token,
            outbox=[{"topic": "keel", "payload": {"x": 1}}],
        )
        assert list(listener.notifies(timeout=0.5, stop_after=1)) == []


# -- the trusted app: context per transaction ----------------------------------------------


def test_the_app_context_does_not_bleed_into_the_next_transaction(world):
    with psycopg.connect(world.app_dsn, autocommit=True, options=CONNECTION_OPTIONS) as conn:
        app = Keel(conn)
        assert app.get_task(world.a.tenant, world.a.task.task_id) is not None
        assert conn.execute("select count(*) from keel.tasks").fetchone()[0] == 0
        with pytest.raises(TaskNotFound):
            app.claim_lease(world.a.tenant, uuid.uuid4(), "w")
        assert conn.execute("select count(*) from keel.tasks").fetchone()[0] == 0
        with pytest.raises(ZeroDivisionError), app.transaction(world.a.tenant):
            raise ZeroDivisionError
        assert conn.execute("select count(*) from keel.tasks").fetchone()[0] == 0


def test_the_app_without_context_sees_nothing_and_writes_nothing(world):
    with psycopg.connect(world.app_dsn, autocommit=True, options=CONNECTION_OPTIONS) as conn:
        assert conn.execute("select count(*) from keel.task_events").fetchone()[0] == 0
        with pytest.raises(psycopg.Error) as info:
            conn.execute(
                "select * from keel.reserve_operation(%s, null, 'k', 'a', 'h')", (world.a.tenant,)
            )
        assert info.value.sqlstate == "42K01"


def test_a_malformed_app_context_fails_closed(world):
    with psycopg.connect(world.app_dsn, options=CONNECTION_OPTIONS) as conn:
        conn.execute("set local keel.tenant_id = 'not-a-uuid'")
        with pytest.raises(psycopg.Error) as info:
            conn.execute("select * from keel.tasks").fetchall()
        assert info.value.sqlstate == "22P02"  # invalid_text_representation: no rows, no guess
