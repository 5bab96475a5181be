"""G7 No transaction across external calls: reserve and commit, call, then reconcile;
the roles that act carry short timeouts."""

from __future__ import annotations

import psycopg
import pytest

from agentkeel.client import Keel
from agentkeel_conformance.fixtures import ROLE_DEFAULTS

pytestmark = pytest.mark.guarantee("G7")


@pytest.mark.parametrize("role", sorted(ROLE_DEFAULTS))
def test_acting_roles_carry_timeout_defaults(connect, role):
    rows = (
        connect()
        .execute(
            "select unnest(setconfig) from pg_db_role_setting"
            " where setrole = %s::regrole and setdatabase = 0",
            (role,),
        )
        .fetchall()
    )
    settings = dict(r[0].split("=", 1) for r in rows)
    for name in ("statement_timeout", "idle_in_transaction_session_timeout"):
        assert name in settings, f"{role} has no default {name}"
        assert settings[name] not in ("0", ""), f"{role} disables {name}"


@pytest.mark.parametrize("role", sorted(ROLE_DEFAULTS))
def test_a_login_role_set_up_as_documented_gets_them(login_role, role):
    with psycopg.connect(login_role(role).dsn) as conn:
        for name, value in ROLE_DEFAULTS[role].items():
            assert conn.execute(f"show {name}").fetchone()[0] == value


def test_a_reservation_is_committed_before_the_call(connect, tenant, new_task):
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
