"""G1 Tenant isolation, attacked from real login roles.

An agent login (member of keel_agent) holding a valid token for tenant A runs arbitrary
SQL: no statement may reveal or change a row of tenant B. An app login (keel_app) is
trusted with a plain context, but still writes only through the guarded functions.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from agentkeel.client import Keel, Task, set_tenant_context, set_tenant_token
from agentkeel.errors import (
    InvalidArgument,
    InvalidTenantToken,
    TaskNotFound,
    TenantContextMismatch,
    TenantContextMissing,
)
from agentkeel_conformance.connections import suite_connect
from agentkeel_conformance.harness import tenant_tables

pytestmark = pytest.mark.guarantee("G1")

OWN_TASKS = "select tenant_id from keel.list_tasks(%s)"

# What an agent may read, and only like this: functions with no free-form predicate.
AGENT_READS = {
    "get_task": lambda k, s: k.get_task(s.tenant, s.task.task_id),
    "list_tasks": lambda k, s: k.list_tasks(s.tenant),
    "task_history": lambda k, s: k.task_events(s.tenant, s.task.task_id),
    "get_operation": lambda k, s: k.get_operation(s.tenant, s.operation_id),
}


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
        tenant, workflow.name, workflow.version, metadata={"owned_by": str(tenant)}
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
def world(app_keel, make_tenant, workflow, login_role) -> World:
    agent, app = login_role("keel_agent"), login_role("keel_app")
    a = _populate(app_keel, make_tenant(), workflow, "key-of-a")
    b = _populate(app_keel, make_tenant(), workflow, "key-of-b")
    return World(a, b, agent.dsn, app.dsn)


@pytest.fixture
def agent(world: World) -> Iterator[Callable[..., list[tuple[Any, ...]]]]:
    """Run one statement as the agent login in its own transaction; token A by default."""
    conn = suite_connect(world.agent_dsn, autocommit=True)

    def run(
        query: str | sql.SQL | sql.Composed,
        params: Any = None,
        *,
        token: str | None = world.a.token,
        setup: tuple[str, ...] = (),
    ) -> list[tuple[Any, ...]]:
        with conn.transaction():
            if token is not None:
                set_tenant_token(conn, token)
            for stmt in setup:
                conn.execute(stmt.encode())
            cur = conn.execute(query if not isinstance(query, str) else query.encode(), params)
            return cur.fetchall() if cur.description else []

    yield run
    conn.close()


def agent_keel(world: World, token: str | None) -> Keel:
    return Keel(suite_connect(world.agent_dsn, autocommit=True), token)


# -- reads ---------------------------------------------------------------------------


@pytest.mark.parametrize("read", sorted(AGENT_READS))
def test_the_agent_reads_its_own_tenant_through_functions(world, read):
    """No mutation: a positive control; the refusals below are what planted bugs break."""
    rows = AGENT_READS[read](agent_keel(world, world.a.token), world.a)
    rows = rows if isinstance(rows, list) else [rows]
    assert rows and {r.tenant_id for r in rows} == {world.a.tenant}


@pytest.mark.parametrize("read", sorted(AGENT_READS))
def test_the_agent_cannot_read_the_other_tenant_through_functions(world, read):
    """No mutation: require_tenant's tenant comparison has no planted bug yet."""
    with pytest.raises(TenantContextMismatch):
        AGENT_READS[read](agent_keel(world, world.a.token), world.b)


def test_the_other_tenants_ids_find_nothing_in_ones_own_tenant(world):
    """No mutation: row-level security (policies/04) has no planted bug yet."""
    keel = agent_keel(world, world.a.token)
    assert keel.get_task(world.a.tenant, world.b.task.task_id) is None
    assert keel.task_events(world.a.tenant, world.b.task.task_id) == []
    assert keel.get_operation(world.a.tenant, world.b.operation_id) is None


@pytest.mark.parametrize("read", sorted(AGENT_READS))
def test_without_a_token_the_agents_reads_fail_closed(world, read):
    """No mutation: require_tenant's null check has no planted bug yet."""
    with pytest.raises(TenantContextMissing):
        AGENT_READS[read](agent_keel(world, None), world.a)


def test_the_agent_login_has_no_privilege_on_any_relation_in_keel(world, connect, login_role):
    """Tables, views, sequences, columns: nothing.
    Mutation: agent_table_select."""
    agent = login_role("keel_agent").name
    rows = (
        connect(owner=True)
        .execute(
            "select c.relname from pg_class as c join pg_namespace as n on n.oid = c.relnamespace"
            " where n.nspname = 'keel' and ("
            "  (c.relkind = 'S' and has_sequence_privilege(%(r)s, c.oid, 'USAGE,SELECT,UPDATE'))"
            "  or (c.relkind <> 'S' and c.relkind in ('r', 'p', 'v', 'm', 'f') and ("
            "   has_table_privilege(%(r)s, c.oid,"
            "    'SELECT,INSERT,UPDATE,DELETE,TRUNCATE,REFERENCES,TRIGGER')"
            "   or has_any_column_privilege(%(r)s, c.oid, 'SELECT,INSERT,UPDATE,REFERENCES'))))",
            {"r": agent},
        )
        .fetchall()
    )
    assert rows == []


@pytest.mark.parametrize(
    "table",
    [
        "tenants",
        "tasks",
        "task_events",
        "operations",
        "outbox",
        "tenant_token_keys",
        "settings",
        "migration_history",
        "workflows",
    ],
)
def test_the_agent_cannot_read_tables(agent, table):
    """Mutation: agent_table_select (the tasks, task_events and operations cases)."""
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        agent(f"select * from keel.{table}")


def test_a_plain_tenant_id_is_ignored_for_the_agent(world, agent):
    """Mutation: plain_tenant_id."""
    setup = (f"set local keel.tenant_id = '{world.b.tenant}'",)
    with pytest.raises(psycopg.Error) as info:
        agent("select * from keel.list_tasks(%s)", (world.b.tenant,), token=None, setup=setup)
    assert info.value.sqlstate == "42K01"
    rows = agent("select tenant_id from keel.list_tasks(%s)", (world.a.tenant,), setup=setup)
    assert {r[0] for r in rows} == {world.a.tenant}


NIL_TENANT = uuid.UUID(int=0)


@pytest.mark.parametrize(
    "call",
    [
        "select * from keel.list_tasks(%s)",
        "select * from keel.get_task(%s, gen_random_uuid())",
        "select keel.create_task(%s, 'no-such-workflow', 1)",
    ],
    ids=["list_tasks", "get_task", "create_task"],
)
def test_the_nil_uuid_names_no_tenant(connect, call):
    """The nil uuid is what a transaction that took tasks of several tenants acts for
    (keel.no_tenant()): no call may name it, nor adopt it as its context. A trusted login
    in autocommit, whose call would otherwise adopt the tenant it names, is refused
    invalid_argument (22K01) before anything is read.
    No mutation: the generated mutants disable require_tenant's check (tests/test_mutants.py)."""
    conn = connect(role="keel_app")
    with pytest.raises(psycopg.Error, match="nil uuid") as info:
        conn.execute(call.encode(), (NIL_TENANT,)).fetchall()
    assert info.value.sqlstate == "22K01"


def test_set_config_does_not_switch_the_agents_tenant(world, agent):
    """Mutation: plain_tenant_id."""
    setup = (f"select set_config('keel.tenant_id', '{world.b.tenant}', false)",)
    rows = agent("select tenant_id from keel.list_tasks(%s)", (world.a.tenant,), setup=setup)
    assert {r[0] for r in rows} == {world.a.tenant}
    with pytest.raises(psycopg.Error) as info:
        agent("select * from keel.list_tasks(%s)", (world.b.tenant,), setup=setup)
    assert info.value.sqlstate == "42K06"


def test_a_tenant_id_an_agent_plants_gives_it_nothing(world):
    """An agent's context is its signed token (on Citus workers, the coordinator's proof of
    it, bound to the agent's login): a plain keel.tenant_id it sets with SET LOCAL, which
    Citus sends on to every worker, counts nowhere. Its calls act in the token's tenant
    and refuse the planted one.
    Mutation: agent_plain_context."""
    with suite_connect(world.agent_dsn, autocommit=True) as conn, conn.transaction():
        conn.execute(sql.SQL("set local keel.tenant_id = {}").format(str(world.b.tenant)))
        set_tenant_token(conn, world.a.token)
        rows = conn.execute("select * from keel.list_tasks(%s)", (world.a.tenant,)).fetchall()
        assert rows
        row = conn.execute(
            "select current_setting('keel.context_stamp', true) = keel.context_stamp(),"
            " keel.current_tenant()"
        ).fetchone()
        assert row == (True, world.a.tenant)
        with pytest.raises(psycopg.Error) as info, conn.transaction():
            conn.execute("select * from keel.list_tasks(%s)", (world.b.tenant,))
        assert info.value.sqlstate == "42K06"


@pytest.mark.parametrize(
    "statement",
    [
        "copy keel.tasks (tenant_id) to stdout",
        "copy (select tenant_id from keel.tasks) to stdout",
        "copy keel.tasks (tenant_id) from stdin",
    ],
)
def test_copy_is_refused(world, statement):
    """Mutation: agent_table_select (the COPY ... TO cases)."""
    with suite_connect(world.agent_dsn) as conn:
        set_tenant_token(conn, world.a.token)
        with (
            pytest.raises(psycopg.errors.InsufficientPrivilege),
            conn.cursor().copy(statement.encode()) as copy,
        ):
            for _ in copy:
                pass


def test_table_statistics_do_not_leak_other_tenants_values(world, connect, agent):
    """pg_stats hides a table under row-level security even from a role that may read it.
    No mutation: so agent_table_select (a SELECT grant) cannot fail it."""
    connect(owner=True).execute("analyze keel.tasks")
    assert agent("select attname from pg_stats where schemaname = 'keel'") == []


def test_explain_estimates_reveal_no_value_only_another_tenant_has(world, keel, connect, agent):
    """The planner uses every tenant's statistics: with any table access, the row estimate
    for a value only tenant B wrote (an event type) differs from one nobody wrote.
    Mutation: agent_table_select."""
    task = world.b.task
    version, token = task.state_version, task.fencing_token
    for i in range(30):
        target = "waiting" if i % 2 == 0 else "running"
        keel.transition_task(
            world.b.tenant,
            task.task_id,
            version,
            target,
            fencing_token=token,
            event_type="b-only-event-type",
        )
        version += 1
    connect(owner=True).execute("analyze keel.task_events")

    def estimate(value: str) -> float | str:
        try:
            plan = agent(
                "explain (format json) select * from keel.task_events where event_type = %s",
                (value,),
            )
        except psycopg.errors.InsufficientPrivilege:
            return "refused"
        return float(plan[0][0][0]["Plan"]["Plan Rows"])

    assert estimate("b-only-event-type") == estimate("no-tenant-wrote-this")


# -- writes --------------------------------------------------------------------------

WRITES = {
    "insert": "insert into {t} (tenant_id) values ('{b}')",
    "update": "update {t} set tenant_id = tenant_id where tenant_id = '{b}'",
    "delete": "delete from {t} where tenant_id = '{b}'",
    "truncate": "truncate {t}",
}


@pytest.mark.parametrize("write", sorted(WRITES))
def test_the_agent_has_no_direct_writes(world, agent, connect, write):
    """Every tenant table the database defines (keel.tenant_tables()), not a list of ours.
    No mutation: no planted bug grants DML; agent_table_select grants SELECT only."""
    tables = tenant_tables(connect())
    assert "keel.tasks" in tables
    for table in tables:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            agent(WRITES[write].format(t=table, b=world.b.tenant))


def test_the_app_writes_only_through_the_guarded_functions(world):
    """No mutation: no planted bug grants the app DML on keel tables."""
    with suite_connect(world.app_dsn) as conn:
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
    """No mutation: require_tenant's tenant comparison has no planted bug yet."""
    before = b_state(world, keel)
    with pytest.raises(TenantContextMismatch):
        CROSS_CALLS[call](agent_keel(world, world.a.token), world)
    assert b_state(world, keel) == before


def test_another_tenants_task_id_is_not_found_in_ones_own_tenant(world, keel):
    """No mutation: the lookup by (tenant_id, task_id) has no planted bug yet."""
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
    """No mutation: EXECUTE grants (policies/03) have no planted bug yet."""
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        agent(f"select {function}", {"a": world.a.tenant})


def test_a_function_call_without_a_token_fails_closed(world):
    """No mutation: require_tenant's null check has no planted bug yet."""
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
    # Parts that are not what they claim to be are refused as malformed, before any part
    # is cast or looked up (a cast error would be another SQLSTATE, and a mistake).
    "key-version-not-a-number": lambda w: tamper(w.a.token, 1, "one"),
    "tenant-not-a-uuid": lambda w: tamper(w.a.token, 2, "tenant-a"),
    "expiry-not-a-number": lambda w: tamper(w.a.token, 3, "soon"),
}


@pytest.mark.parametrize("attack", sorted(TOKEN_ATTACKS))
def test_altered_or_forged_tokens_are_refused(world, agent, attack):
    """No mutation: the generated mutants disable each token check (tests/test_mutants.py)."""
    with pytest.raises(psycopg.Error) as info:
        agent(OWN_TASKS, (world.a.tenant,), token=TOKEN_ATTACKS[attack](world))
    assert info.value.sqlstate == "42K07"
    with pytest.raises(InvalidTenantToken):
        agent_keel(world, TOKEN_ATTACKS[attack](world)).renew_lease(
            world.b.tenant, world.b.task.task_id, 1
        )


def wait_for_the_database_clock_past(conn: psycopg.Connection, token: str) -> None:
    """Until the server's clock has passed the token's expiry: a condition, not a sleep of
    a guessed length (the expiry is the token's fourth part, in epoch seconds)."""
    expiry = int(token.split(".")[3])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        row = conn.execute("select clock_timestamp() > to_timestamp(%s)", (expiry,)).fetchone()
        if row and row[0]:
            return
        time.sleep(0.1)
    pytest.fail("the database clock never passed the token's expiry")


def test_an_expired_token_is_refused(world, app_keel, agent):
    """No mutation: verify_tenant_token's expiry check has no planted bug yet."""
    short = app_keel.mint_tenant_token(world.a.tenant, timedelta(seconds=5))
    with suite_connect(world.agent_dsn, autocommit=True) as conn:
        wait_for_the_database_clock_past(conn, short)
    with pytest.raises(psycopg.Error) as info:
        agent(OWN_TASKS, (world.a.tenant,), token=short)
    assert info.value.sqlstate == "42K07"


def test_a_token_expiring_inside_an_open_transaction_stops_working_there(world, app_keel):
    """A token is judged when it is used, not at the start of the transaction that bound
    it: a transaction kept open past the expiry cannot go on acting for the tenant.
    Mutation: expiry_at_transaction_start."""
    short = app_keel.mint_tenant_token(world.a.tenant, timedelta(seconds=5))
    expiry = int(short.split(".")[3])
    with suite_connect(world.agent_dsn, autocommit=True) as conn, conn.transaction():
        set_tenant_token(conn, short)
        row = conn.execute("select now() < to_timestamp(%s)", (expiry,)).fetchone()
        if not row or not row[0]:
            pytest.skip("inconclusive: the transaction began after the token had expired")
        wait_for_the_database_clock_past(conn, short)
        with pytest.raises(psycopg.Error) as info, conn.transaction():
            conn.execute(OWN_TASKS, (world.a.tenant,)).fetchall()
    assert info.value.sqlstate == "42K07"


def test_a_retired_key_verifies_nothing(world, app_keel, agent, connect, throwaway_database):
    """No mutation: key retirement in verify_tenant_token has no planted bug yet."""
    if not throwaway_database:
        pytest.skip("retiring signing keys would invalidate live tokens: embedded cluster only")
    connect(owner=True).execute("select keel.rotate_tenant_token_key(true)")
    with pytest.raises(psycopg.Error) as info:
        agent(OWN_TASKS, (world.a.tenant,), token=world.a.token)
    assert info.value.sqlstate == "42K07"
    fresh = app_keel.mint_tenant_token(world.a.tenant)
    assert {r[0] for r in agent(OWN_TASKS, (world.a.tenant,), token=fresh)} == {world.a.tenant}


def test_a_key_retired_inside_an_open_transaction_stops_its_tokens_there(
    world, app_keel, connect, throwaway_database
):
    """Retirement is judged at call time: an agent transaction that bound a token keeps no
    snapshot in which the key is still active. In READ COMMITTED the next statement sees the
    retirement; a repeatable-read or serializable transaction, whose snapshot would hide
    it, is refused any token at all.
    Mutation: token_snapshot_isolation."""
    for level in ("repeatable read", "serializable"):
        with suite_connect(world.agent_dsn) as conn:
            conn.execute(f"set transaction isolation level {level}".encode())
            with pytest.raises(psycopg.Error, match="READ COMMITTED") as info:
                set_tenant_token(conn, world.a.token)
                conn.execute(OWN_TASKS, (world.a.tenant,)).fetchall()
            assert info.value.sqlstate == "42K07"
    if not throwaway_database:
        return  # retiring signing keys would invalidate live tokens: embedded cluster only
    with suite_connect(world.agent_dsn) as conn:
        set_tenant_token(conn, world.a.token)
        assert {r[0] for r in conn.execute(OWN_TASKS, (world.a.tenant,))} == {world.a.tenant}
        connect(owner=True).execute("select keel.rotate_tenant_token_key(true)")
        with pytest.raises(psycopg.Error, match="retired") as info:
            conn.execute(OWN_TASKS, (world.a.tenant,)).fetchall()
        assert info.value.sqlstate == "42K07"


def test_the_agent_cannot_read_signing_keys_or_sign(agent):
    """No mutation: agent_table_select leaves tenant_token_keys alone; none other fits."""
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
    """No mutation: SET ROLE is PostgreSQL's membership check on policies/01's roles."""
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        agent(escape)


def test_reset_role_and_set_role_to_its_own_group_keep_it_untrusted(world, agent, on_citus):
    """On Citus the call after SET ROLE to the NOLOGIN group is refused even earlier: Citus
    reaches the worker as the current role, which may not log in (docs/citus.md).
    No mutation: unbound, the stamp check refuses first; plain_tenant_id never reaches it."""
    for setup in (("reset role",), ("set local role keel_agent",)):
        plain = (*setup, f"set local keel.tenant_id = '{world.b.tenant}'")
        with pytest.raises(psycopg.Error) as info:
            agent("select * from keel.list_tasks(%s)", (world.b.tenant,), token=None, setup=plain)
        refused_login = on_citus and "is not permitted to log in" in str(info.value)
        assert info.value.sqlstate == "42K01" or refused_login, info.value


# -- oracles and side channels -------------------------------------------------------------


def test_idempotency_keys_are_no_existence_oracle(world, keel):
    """No mutation: the tenant-scoped unique key is schema, not a repeatable file."""
    r = keel.reserve_operation(world.a.tenant, None, "key-of-b", "charge", "different")
    assert r.outcome == "reserved"  # tenant B's key is invisible and irrelevant


def test_task_ids_are_no_existence_oracle(world, keel, workflow):
    """No mutation: the (tenant_id, task_id) primary key is schema, not a repeatable file."""
    same_id = keel.create_task(
        world.a.tenant, workflow.name, workflow.version, task_id=world.b.task.task_id
    )
    assert same_id.tenant_id == world.a.tenant


def test_advisory_locks_held_by_the_agent_do_not_block_other_tenants(world, keel, agent):
    """No mutation: no shipped function takes advisory locks: nothing to plant."""
    conn = suite_connect(world.agent_dsn, autocommit=True)
    try:
        for key in (world.b.task.task_id.int & 0x7FFF_FFFF_FFFF_FFFF, 0, 1, 42):
            conn.execute("select pg_advisory_lock(%s)", (key,))
        # Waiting on any of the agent's locks would end in lock_not_available, not pass.
        with keel.transaction(world.b.tenant) as own:
            own.execute("set local lock_timeout = '2s'")
            renewed = keel.renew_lease(
                world.b.tenant, world.b.task.task_id, world.b.task.fencing_token
            )
            done = keel.transition_task(
                world.b.tenant,
                world.b.task.task_id,
                2,
                "done",
                fencing_token=world.b.task.fencing_token,
            )
        assert (renewed.lease_owner, renewed.fencing_token) == ("setup", world.b.task.fencing_token)
        assert (done.state, done.state_version) == ("done", 3)
    finally:
        conn.close()


# -- the trusted app: context per transaction ----------------------------------------------


def test_the_app_context_does_not_bleed_into_the_next_transaction(world):
    """No mutation: SET LOCAL ends with its transaction in PostgreSQL itself."""
    with suite_connect(world.app_dsn, autocommit=True) as conn:
        app = Keel(conn)
        assert app.get_task(world.a.tenant, world.a.task.task_id) is not None
        assert conn.execute("select count(*) from keel.tasks").fetchone() == (0,)
        with pytest.raises(TaskNotFound):
            app.claim_lease(world.a.tenant, uuid.uuid4(), "w")
        assert conn.execute("select count(*) from keel.tasks").fetchone() == (0,)
        with pytest.raises(ZeroDivisionError), app.transaction(world.a.tenant):
            raise ZeroDivisionError
        assert conn.execute("select count(*) from keel.tasks").fetchone() == (0,)


# A context left at session level (a plain SET, set_config(..., false), even with a stamp
# copied at session level) is what a transaction pooler hands the next client of the
# backend: later transactions ignore it. The same connection stands in for that backend.
SESSION_LEFTOVERS = {
    "set": lambda tenant: sql.SQL("set keel.tenant_id = {}").format(str(tenant)),
    "set_config": lambda tenant: sql.SQL("select set_config('keel.tenant_id', {}, false)").format(
        str(tenant)
    ),
    "set_config with a stamp": lambda tenant: sql.SQL(
        "select set_config('keel.tenant_id', {}, false),"
        " set_config('keel.context_stamp', keel.context_stamp(), false)"
    ).format(str(tenant)),
}


def _sees_nothing_of(conn: psycopg.Connection, side: Side, other: Side | None = None) -> None:
    """The leftover is not this transaction's context. An agent's call then has no context
    at all (42K01). A trusted login's call runs in the tenant it names (keel.require_tenant)
    and so sees no row of another: were the leftover honoured, naming `other` would be a
    mismatch (42K06)."""
    assert conn.execute("select keel.current_tenant()").fetchone() == (None,)
    if other is not None:
        row = conn.execute(
            "select count(*) from keel.get_task(%s, %s)", (other.tenant, side.task.task_id)
        ).fetchone()
        assert row == (0,)
        return
    with pytest.raises(psycopg.Error) as info:
        conn.execute("select * from keel.get_task(%s, %s)", (side.tenant, side.task.task_id))
    assert info.value.sqlstate == "42K01"


@pytest.mark.parametrize("leftover", sorted(SESSION_LEFTOVERS))
def test_a_session_level_app_context_is_ignored_by_later_transactions(world, leftover):
    """Mutation: session_context."""
    with suite_connect(world.app_dsn, autocommit=True) as conn:
        conn.execute(SESSION_LEFTOVERS[leftover](world.a.tenant))
        assert conn.execute("select count(*) from keel.tasks").fetchone() == (0,)
        _sees_nothing_of(conn, world.a, other=world.b)


def test_a_session_level_agent_token_is_ignored_by_later_transactions(world):
    """Mutation: session_context."""
    with suite_connect(world.agent_dsn, autocommit=True) as conn:
        conn.execute(
            "select set_config('keel.tenant_token', %s, false),"
            " set_config('keel.context_stamp', keel.context_stamp(), false)",
            (world.a.token,),
        )
        _sees_nothing_of(conn, world.a)


def test_the_app_without_context_sees_nothing_and_acts_only_in_the_tenant_it_names(world, on_citus):
    """A trusted login's call with no context runs in the tenant it names, for that one
    transaction (keel.require_tenant): one round trip. Its table reads without a context
    see nothing, the adopted context ends with the transaction, and a transaction that
    has a tenant refuses another (42K06). On Citus a call in a transaction block adopts
    nothing (its node could not tell the others): the block must set its tenant first
    (42K01 otherwise), so it cannot act for two either.
    Mutation: adopt_any_tenant."""
    with suite_connect(world.app_dsn, autocommit=True) as conn:
        assert conn.execute("select count(*) from keel.task_events").fetchone() == (0,)
        row = conn.execute(
            "select outcome from keel.reserve_operation(%s, null, 'adopted', 'a', 'h')",
            (world.a.tenant,),
        ).fetchone()
        assert row == ("reserved",)
        assert conn.execute("select keel.current_tenant()").fetchone() == (None,)
        assert conn.execute("select count(*) from keel.operations").fetchone() == (0,)
        with pytest.raises(psycopg.Error) as info, conn.transaction():
            conn.execute("select * from keel.get_task(%s, %s)", (world.a.tenant, uuid.uuid4()))
            conn.execute("select * from keel.get_task(%s, %s)", (world.b.tenant, uuid.uuid4()))
        assert info.value.sqlstate == ("42K01" if on_citus else "42K06")


def test_a_malformed_app_context_fails_closed(world):
    """No mutation: the failing uuid cast is PostgreSQL's, not a shipped function's."""
    with suite_connect(world.app_dsn) as conn:
        conn.execute("set local keel.tenant_id = 'not-a-uuid'")
        conn.execute("select keel.bind_tenant_context()")
        with pytest.raises(psycopg.Error) as info:
            conn.execute("select * from keel.tasks").fetchall()
        assert info.value.sqlstate == "22P02"  # invalid_text_representation: no rows, no guess


# -- tokens are credentials: never in query text -------------------------------------------


def test_no_session_of_the_same_login_sees_the_token_in_pg_stat_activity(world, keel, workflow):
    """pg_stat_activity.query is visible to every session of the same login: the client
    sends the token only as a bind parameter.
    No mutation: the bind parameter is the Python client's doing, not shipped SQL."""
    secret = world.a.token.split(".")[-1]  # the signature: enough to impersonate
    seen: list[str] = []
    stop = threading.Event()
    with suite_connect(world.agent_dsn, autocommit=True) as spy:

        def watch() -> None:
            while not stop.is_set():
                seen.extend(
                    row[0]
                    for row in spy.execute(
                        "select query from pg_stat_activity"
                        " where usename = current_user and pid <> pg_backend_pid()"
                    )
                )

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            victim = agent_keel(world, world.a.token)
            for _ in range(30):
                victim.get_task(world.a.tenant, world.a.task.task_id)
                victim.list_tasks(world.a.tenant)
                victim.task_events(world.a.tenant, world.a.task.task_id)
        finally:
            stop.set()
            watcher.join()
    assert any("keel." in query for query in seen), "the spy never saw the victim's queries"
    assert not [query for query in seen if secret in query]


def test_token_lifetimes_are_checked_as_timestamps(world, app_keel):
    """'1000 years -359999 days' compares as one day (the cap) but lasts 14 years.
    Mutation: interval_compared."""
    for ttl in ("1000 years -359999 days", "-1000 years 360001 days", "25 hours"):
        with pytest.raises(InvalidArgument), app_keel.transaction(world.a.tenant) as conn:
            conn.execute("select keel.mint_tenant_token(%s, %s::interval)", (world.a.tenant, ttl))


def test_a_token_bound_to_one_agent_login_is_refused_to_another(world, app_keel, login_role):
    """Every agent its own login: a token minted for one (p_login) is worth nothing to
    another agent login that gets hold of it, even for the same tenant and inside its
    validity; its own login uses it.
    Mutation: token_login_unchecked."""
    own = login_role("keel_agent")
    other = login_role("keel_agent", "second")
    token = app_keel.mint_tenant_token(world.a.tenant, login=own.name)
    assert token.startswith("v2.")
    mine = Keel(suite_connect(own.dsn, autocommit=True), token)
    assert {t.tenant_id for t in mine.list_tasks(world.a.tenant)} == {world.a.tenant}
    stolen = Keel(suite_connect(other.dsn, autocommit=True), token)
    with pytest.raises(InvalidTenantToken, match="minted for another login"):
        stolen.list_tasks(world.a.tenant)
    # SET ROLE changes current_user, not the login a token is bound to.
    with suite_connect(other.dsn) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(sql.SQL("set role {}").format(sql.Identifier(own.name)))


def test_a_token_is_bound_only_to_an_agent_login(world, app_keel, login_role):
    """A login outside keel_agent, or no role at all, cannot be bound: the mint is refused
    (22K01) and nothing is minted.
    No mutation: a token bound to such a login is one no agent could use."""
    for login in (login_role("keel_app").name, "no_such_login_" + uuid.uuid4().hex[:8]):
        with pytest.raises(InvalidArgument, match="member of keel_agent"):
            app_keel.mint_tenant_token(world.a.tenant, login=login)
