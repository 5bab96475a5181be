"""A tenant's checkpoint bytes (keel.tenant_usage, max_tenant_checkpoint_bytes) on an
install that held checkpoints before the counter existed, and after the owner removed rows
by hand; `agentkeel tenant quota`, on one node and on the Citus cluster."""

from __future__ import annotations

import json
import os
import threading
import uuid
from datetime import timedelta

import psycopg
import pytest

from agentkeel.checkpoints import StaticKeyProvider
from agentkeel.client import Keel
from agentkeel.errors import QuotaExceeded
from agentkeel.exitcodes import ExitCode
from agentkeel.sessions import Sessions
from agentkeel_conformance.harness import in_tenant, wait_for
from conftest import run_agentkeel, temporary_login

WORKFLOW = [("queued", "running"), ("running", "done")]


def test_a_tenant_that_held_checkpoints_before_the_counter_is_counted_in_full(migrated_db):
    """Migration 0046 counts nothing: a tenant's first save after it counts what the tenant
    holds (the migration, under forced row-level security, would see no tenant's rows).
    Two checkpoints saved, the counter row removed (an install upgraded to 0046), a limit
    of two and a half checkpoints: the third save counts all three and is refused. A
    checkpoint the owner removes by hand stays counted until keel.recount_tenant_usage."""
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        ledger = Keel(conn, key_provider=StaticKeyProvider(os.urandom(32)))
        ledger.define_workflow("usage", 1, "queued", WORKFLOW)
        tenant = ledger.create_tenant("usage", uuid.uuid4()).tenant_id
        task = ledger.create_task(tenant, "usage", 1).task_id
        token = ledger.claim_lease(tenant, task, "usage", timedelta(minutes=5)).fencing_token
        saved = [ledger.save_checkpoint(tenant, task, token, "INPUT", {"n": n}) for n in (1, 2)]
        with in_tenant(conn, tenant):
            (size,) = conn.execute(  # type: ignore[misc]
                "select max(octet_length(ciphertext)) from keel.checkpoint_payloads"
                " where tenant_id = %s",
                (tenant,),
            ).fetchone()
            conn.execute("delete from keel.tenant_usage where tenant_id = %s", (tenant,))
        conn.execute(
            "select keel.set_tenant_quota(%s, 'max_tenant_checkpoint_bytes', %s)",
            (tenant, 2 * size + size // 2),
        )
        with pytest.raises(QuotaExceeded) as info:
            ledger.save_checkpoint(tenant, task, token, "INPUT", {"n": 3})
        assert f"would be {3 * size} with these {size}" in info.value.message
        with in_tenant(conn, tenant):
            conn.execute(
                "delete from keel.checkpoints where tenant_id = %s and checkpoint_id = %s",
                (tenant, saved[0].checkpoint_id),
            )
        ledger.save_checkpoint(tenant, task, token, "INPUT", {"n": 3})  # counted: 2 held
        with in_tenant(conn, tenant):
            conn.execute(
                "delete from keel.checkpoints where tenant_id = %s and checkpoint_id = %s",
                (tenant, saved[1].checkpoint_id),
            )
        with pytest.raises(QuotaExceeded):  # the counter still holds the removed bytes
            ledger.save_checkpoint(tenant, task, token, "INPUT", {"n": 4})
        recount = conn.execute("select keel.recount_tenant_usage(%s)", (tenant,)).fetchone()
        assert recount == (size,)
        ledger.save_checkpoint(tenant, task, token, "INPUT", {"n": 4})


def quota_json(dsn: str, tenant: uuid.UUID, *args: str) -> dict[str, dict[str, object]]:
    result = run_agentkeel("tenant", "quota", str(tenant), "--dsn", dsn, "--format", "json", *args)
    assert result.returncode == 0, result.stderr
    return {q["setting"]: q for q in json.loads(result.stdout)["quotas"]}


def a_tenant_with_a_session_and_checkpoints(dsn: str) -> tuple[uuid.UUID, int]:
    """A tenant with one session and two checkpoints; returns it and its checkpoint bytes."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        ledger = Keel(conn, key_provider=StaticKeyProvider(os.urandom(32)))
        ledger.define_workflow("usage", 1, "queued", WORKFLOW)
        tenant = ledger.create_tenant("usage", uuid.uuid4()).tenant_id
        task = ledger.create_task(tenant, "usage", 1).task_id
        token = ledger.claim_lease(tenant, task, "usage", timedelta(minutes=5)).fencing_token
        for n in (1, 2):
            ledger.save_checkpoint(tenant, task, token, "INPUT", {"n": n})
        Sessions(conn).save(tenant, "usage-1", {"turn": 0})
        with in_tenant(conn, tenant):
            row = conn.execute(
                "select sum(octet_length(ciphertext))::bigint from keel.checkpoint_payloads"
                " where tenant_id = %s",
                (tenant,),
            ).fetchone()
    assert row is not None
    return tenant, int(row[0])


def check_the_quota_command(dsn: str, owner: str) -> None:
    """dsn: a superuser's, to make the tenant; owner: the migrator's, to run the command."""
    tenant, held = a_tenant_with_a_session_and_checkpoints(dsn)
    shown = quota_json(owner, tenant)
    assert shown["max_tenant_sessions"] == {
        "setting": "max_tenant_sessions",
        "per": "tenant",
        "quota": 100_000,
        "own": False,
        "used": 1,
    }
    assert shown["max_tenant_checkpoint_bytes"]["used"] == held
    assert shown["max_task_checkpoints"]["used"] is None
    shown = quota_json(
        owner,
        tenant,
        "--set",
        "max_tenant_sessions=1",
        "--set",
        f"max_tenant_checkpoint_bytes={2**40}",
    )
    assert shown["max_tenant_sessions"]["quota"] == 1 and shown["max_tenant_sessions"]["own"]
    assert shown["max_tenant_checkpoint_bytes"]["quota"] == 2**40
    with psycopg.connect(dsn, autocommit=True) as conn, pytest.raises(QuotaExceeded):
        Sessions(conn).save(tenant, "usage-2", {"turn": 0})
    shown = quota_json(owner, tenant, "--unset", "max_tenant_sessions")
    assert shown["max_tenant_sessions"]["quota"] == 100_000
    assert not shown["max_tenant_sessions"]["own"] and shown["max_tenant_checkpoint_bytes"]["own"]
    human = run_agentkeel("tenant", "quota", str(tenant), "--dsn", owner)
    assert human.returncode == 0, human.stderr
    [line] = [x for x in human.stdout.splitlines() if x.startswith("max_tenant_checkpoint_bytes")]
    assert line.split() == ["max_tenant_checkpoint_bytes", f"{held:,}", "of", f"{2**40:,}", "own"]


def test_the_quota_command_shows_sets_and_unsets_a_tenants_limits(migrated_db):
    """`agentkeel tenant quota` as the owner: every limit with its source and what the tenant
    holds; --set and --unset change the tenant's own; the limit set is the one enforced."""
    with temporary_login(migrated_db, "keel_owner") as owner:
        check_the_quota_command(migrated_db, owner)


def test_the_quota_command_refuses_bad_input_with_its_exit_code(migrated_db):
    tenant, _ = a_tenant_with_a_session_and_checkpoints(migrated_db)
    cases = [
        ((str(tenant), "--set", "max_sessions=3"), ExitCode.USAGE, "is not one of"),
        ((str(tenant), "--set", "max_tenant_sessions=-1"), ExitCode.USAGE, "a whole number"),
        (
            (str(tenant), "--set", "max_tenant_sessions=10000000000"),
            ExitCode.DATABASE_ERROR,
            "22K01",
        ),
        (
            (str(uuid.uuid4()), "--set", "max_tenant_sessions=3"),
            ExitCode.DATABASE_ERROR,
            "unknown tenant",
        ),
    ]
    for args, code, text in cases:
        result = run_agentkeel("tenant", "quota", *args, "--dsn", migrated_db)
        assert (result.returncode, text in result.stderr) == (code, True), result.stderr
        errors = [x for x in result.stderr.splitlines() if x.startswith(("Error:", "agentkeel:"))]
        assert len(errors) == 1, result.stderr  # one line says what is wrong
    with temporary_login(migrated_db, "keel_app") as app:
        result = run_agentkeel("tenant", "quota", str(tenant), "--dsn", app)
        assert result.returncode == ExitCode.PERMISSION, result.stderr
    assert quota_json(migrated_db, tenant)["max_tenant_sessions"]["own"] is False


@pytest.mark.citus
def test_on_citus_the_quota_command_and_the_byte_counter_work(citus_keel):
    """The same on the cluster, the command run by a migrator login: the counter row lives
    with the tenant's other rows, on its node."""
    with temporary_login(citus_keel, "keel_owner") as owner:
        check_the_quota_command(citus_keel, owner)


def test_saves_of_two_tasks_in_one_transaction_beside_another_saver_do_not_deadlock(
    migrated_db,
):
    """The counter row is taken before the task's row: a transaction that saves on task 1
    and then on task 2, beside another that saves on task 2 in between, makes the other
    wait for it and both succeed. (With the counter taken last, the second save on task 2
    closed a cycle, and one of them failed with 40P01.)"""
    provider = StaticKeyProvider(os.urandom(32))
    with psycopg.connect(migrated_db, autocommit=True) as setup:
        ledger = Keel(setup, key_provider=provider)
        ledger.define_workflow("usage", 1, "queued", WORKFLOW)
        tenant = ledger.create_tenant("usage", uuid.uuid4()).tenant_id
        tasks = [ledger.create_task(tenant, "usage", 1).task_id for _ in range(2)]
        tokens = [
            ledger.claim_lease(tenant, t, "usage", timedelta(minutes=5)).fencing_token
            for t in tasks
        ]
        ledger.save_checkpoint(tenant, tasks[0], tokens[0], "INPUT", {"first": True})
    first = psycopg.connect(migrated_db, autocommit=True)
    second = psycopg.connect(migrated_db, autocommit=True)
    outcome: list[BaseException | str] = []

    def other_save() -> None:
        try:
            Keel(second, key_provider=provider).save_checkpoint(
                tenant, tasks[1], tokens[1], "INPUT", {"other": True}
            )
            outcome.append("saved")
        except BaseException as error:  # reported below
            outcome.append(error)

    try:
        one = Keel(first, key_provider=provider)
        with first.transaction():
            one.save_checkpoint(tenant, tasks[0], tokens[0], "INPUT", {"n": 1})
            (pid,) = first.execute("select pg_backend_pid()").fetchone()  # type: ignore[misc]
            thread = threading.Thread(target=other_save)
            thread.start()
            wait_for(
                lambda: (
                    outcome
                    or first.execute(
                        "select 1 from pg_stat_activity where %s = any(pg_blocking_pids(pid))",
                        (pid,),
                    ).fetchone()
                ),
                "the other save to wait on this transaction",
            )
            one.save_checkpoint(tenant, tasks[1], tokens[1], "INPUT", {"n": 2})
        thread.join(60)
    finally:
        first.close()
        second.close()
    assert outcome == ["saved"]


def test_a_purge_before_the_first_counted_save_is_counted_once(migrated_db):
    """On an install upgraded to 0046 (no counter row yet), a purge removes a checkpoint
    and writes its credit; the tenant's first save then counts what it holds, with the
    credit added back and folded off again: the counter ends at what is held."""
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        ledger = Keel(conn, key_provider=StaticKeyProvider(os.urandom(32)))
        ledger.define_workflow("usage", 1, "queued", WORKFLOW)
        tenant = ledger.create_tenant("usage", uuid.uuid4()).tenant_id
        task = ledger.create_task(tenant, "usage", 1).task_id
        token = ledger.claim_lease(tenant, task, "usage", timedelta(minutes=5)).fencing_token
        first = ledger.save_checkpoint(tenant, task, token, "INPUT", {"n": 1})
        ledger.save_checkpoint(tenant, task, token, "INPUT", {"n": 2})
        with in_tenant(conn, tenant):
            conn.execute("delete from keel.tenant_usage where tenant_id = %s", (tenant,))
        ledger.invalidate_checkpoint(tenant, first.checkpoint_id, token)
        conn.execute(
            "select keel.set_tenant_retention(%s, 'retain_old_checkpoints', '0')", (tenant,)
        )
        removed = conn.execute("select relation, removed from keel.purge(%s, 100)", (tenant,))
        assert ("keel.checkpoint_payloads", 1) in removed.fetchall()
        ledger.save_checkpoint(tenant, task, token, "INPUT", {"n": 3})
        with in_tenant(conn, tenant):
            row = conn.execute(
                "select (select amount from keel.tenant_usage where tenant_id = %s),"
                " (select sum(octet_length(ciphertext)) from keel.checkpoint_payloads"
                " where tenant_id = %s),"
                " (select count(*) from keel.tenant_usage_credits where tenant_id = %s)",
                (tenant, tenant, tenant),
            ).fetchone()
    assert row is not None and row[0] == row[1] and row[2] == 0, row
