"""G7 No transaction across external calls: reserve and commit, call, then reconcile;
the roles that act carry short timeouts."""

from __future__ import annotations

import time

import psycopg
import pytest

from agentkeel.client import Keel
from agentkeel_conformance.fixtures import role_defaults

pytestmark = pytest.mark.guarantee("G7")

ACTING_ROLES = ("keel_agent", "keel_worker")


@pytest.mark.parametrize("role", ACTING_ROLES)
def test_acting_roles_carry_timeout_defaults(connect, role):
    """The group roles as the migration left them, read from pg_db_role_setting.
    Mutation: agent_idle_unbounded (keel_agent's case)."""
    settings = role_defaults(connect(), role)
    for name in ("statement_timeout", "idle_in_transaction_session_timeout"):
        assert name in settings, f"{role} has no default {name}"
        assert settings[name] not in ("0", ""), f"{role} disables {name}"


def test_agents_carry_a_transaction_timeout_where_the_server_has_one(connect):
    """PostgreSQL 17+ bounds a whole agent transaction, however busy it keeps itself; 15
    and 16 have no such setting (docs/security.md: the watchdog instead).
    No mutation: a catalog property of policies/06, checked directly."""
    conn = connect()
    version = conn.execute("select current_setting('server_version_num')::int").fetchone()
    if version is None or version[0] < 170000:
        pytest.skip("transaction_timeout exists from PostgreSQL 17 on")
    settings = role_defaults(conn, "keel_agent")
    assert settings.get("transaction_timeout") not in (None, "0", "")


def test_an_agent_login_left_idle_in_a_transaction_is_terminated(login_role):
    """What the server enforces on a real keel_agent login set up as docs/security.md says (the
    group's settings copied on): an agent that holds a transaction open across a slow
    external call loses it.
    Mutation: agent_idle_unbounded."""
    conn = psycopg.connect(login_role("keel_agent").dsn)
    try:
        row = conn.execute(
            "select setting::integer from pg_catalog.pg_settings"
            " where name = 'idle_in_transaction_session_timeout'"
        ).fetchone()
        timeout_ms = row[0] if row else 0
        assert 0 < timeout_ms <= 60_000, f"an idle agent transaction is kept {timeout_ms} ms"
        time.sleep(timeout_ms / 1000 + 1)  # the transaction psycopg opened sits idle
        # 25P03 when the server's message arrives first, a closed connection otherwise.
        with pytest.raises(
            (psycopg.errors.IdleInTransactionSessionTimeout, psycopg.OperationalError)
        ):
            conn.execute("select 1")
    finally:
        conn.close()


def test_a_reservation_is_committed_before_the_call(connect, tenant, new_task):
    """The reservation survives the caller's death during the call: it was committed first.
    No mutation: no function holds a transaction open: there is nothing to plant."""
    task = new_task()
    worker = Keel(connect())
    lease = worker.claim_lease(tenant, task.task_id, "w")
    op = worker.reserve_operation(
        tenant, task.task_id, "k", "call", "h", fencing_token=lease.fencing_token
    )
    # The worker dies during the external call: its connection is gone, nothing was open.
    worker.conn.close()
    observer = Keel(connect())
    stored = observer.get_operation(tenant, op.operation_id)
    assert stored is not None and stored.state == "reserved"
    assert stored.reserved_fencing_token == lease.fencing_token
