"""`agentkeel recover`: the recoverer once or in a loop, its output, and its one error path."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
import uuid
from datetime import timedelta

import psycopg
import pytest
from psycopg import conninfo, sql

from agentkeel.client import Keel
from agentkeel.exitcodes import ExitCode
from conftest import AGENTKEEL, run_agentkeel

EDGES = [("queued", "running"), ("running", "done"), ("running", "failed")]
SHORT = timedelta(milliseconds=100)


def stale_tasks(dsn: str, count: int, tenants: int = 1) -> set[tuple[str, str]]:
    """count tasks per tenant whose worker claimed them and died; (tenant, task) ids."""
    made = set()
    with psycopg.connect(dsn, autocommit=True) as conn:
        keel = Keel(conn)
        keel.define_workflow("wf", 1, "queued", EDGES)
        for _ in range(tenants):
            tenant = keel.create_tenant(f"t-{uuid.uuid4().hex[:6]}").tenant_id
            for _ in range(count):
                task = keel.create_task(tenant, "wf", 1)
                keel.claim_lease(tenant, task.task_id, "dead-worker", SHORT)
                made.add((str(tenant), str(task.task_id)))
    time.sleep(SHORT.total_seconds() + 0.1)
    return made


def test_once_recovers_every_stale_task_in_batches_and_reports_them(migrated_db):
    made = stale_tasks(migrated_db, 3, tenants=2)
    result = run_agentkeel("recover", "--dsn", migrated_db, "--limit", "4", "--format", "json")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert {(r["tenant_id"], r["task_id"]) for r in rows} == made  # two batches: 4, then 2
    assert {(r["outcome"], r["recovery_attempts"], r["previous_owner"]) for r in rows} == {
        ("recovered", 1, "dead-worker")
    }
    with psycopg.connect(migrated_db) as conn:
        actors = conn.execute(
            "select distinct claimed_actor from keel.task_events where event_type = 'RECOVERED'"
        ).fetchall()
    assert actors and actors[0][0].startswith("agentkeel-recover@")
    again = run_agentkeel("recover", "--dsn", migrated_db)
    assert again.returncode == 0
    assert "0 stale task(s) handled" in again.stdout


def test_an_exhausted_task_is_reported_with_its_failure_state(migrated_db):
    stale_tasks(migrated_db, 1)
    result = run_agentkeel("recover", "--dsn", migrated_db, "--max-attempts", "0")
    assert result.returncode == 0, result.stderr
    assert "recovery exhausted after 0 attempt(s): state failed" in result.stdout
    assert "1 stale task(s) handled" in result.stdout


def test_the_loop_keeps_recovering_until_it_is_stopped(migrated_db):
    env = {k: v for k, v in os.environ.items() if k != "AGENTKEEL_DSN"}
    proc = subprocess.Popen(
        [*AGENTKEEL, "recover", "--dsn", migrated_db, "--interval", "0.2", "--format", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        time.sleep(1)  # a few empty rounds first
        made = stale_tasks(migrated_db, 1)
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "the loop printed nothing in 30 s"
        line = proc.stdout.readline()
        assert (json.loads(line)["tenant_id"], json.loads(line)["task_id"]) in made
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == ExitCode.INTERRUPTED, stderr
    assert "interrupted" in stderr


def test_a_limit_over_the_databases_batch_limit_is_lowered_with_a_warning(migrated_db):
    """--limit is fitted to settings.max_batch_items (the limit of every claim, which the
    database enforces), as the relay fits --batch: a warning, then every stale task."""
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        conn.execute("update keel.settings set value = '3' where setting = 'max_batch_items'")
    made = stale_tasks(migrated_db, 5)
    result = run_agentkeel("recover", "--dsn", migrated_db, "--limit", "10", "--format", "json")
    assert result.returncode == 0, result.stderr
    assert "--limit lowered to settings.max_batch_items (3)" in result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert {(r["tenant_id"], r["task_id"]) for r in rows} == made  # batches of 3, then 2
    with (
        psycopg.connect(migrated_db, autocommit=True) as conn,
        pytest.raises(psycopg.Error) as info,
    ):
        conn.execute("select * from keel.recover_stale_tasks(4)")
    assert info.value.sqlstate == "22K01" and "1 to 3 items" in str(info.value)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "needs a database"),
        (("--dsn", "DSN", "--once", "--interval", "1"), "exclude each other"),
        (("--dsn", "DSN", "--limit", "0"), "--limit"),
    ],
)
def test_usage_errors_exit_2(migrated_db, args, message):
    result = run_agentkeel("recover", *[migrated_db if a == "DSN" else a for a in args])
    assert result.returncode == ExitCode.USAGE
    assert message in result.stderr


def test_an_unmigrated_database_and_a_role_without_the_grant_are_told_apart(make_db, migrated_db):
    result = run_agentkeel("recover", "--dsn", make_db())
    assert result.returncode == ExitCode.SCHEMA_MISSING, result.stderr
    name = f"akt_app_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        conn.execute(sql.SQL("create role {} login in role keel_app").format(sql.Identifier(name)))
    try:
        app = run_agentkeel("recover", "--dsn", conninfo.make_conninfo(migrated_db, user=name))
        assert app.returncode == ExitCode.PERMISSION, app.stderr
        assert "permission denied" in app.stderr
    finally:
        with psycopg.connect(migrated_db, autocommit=True) as conn:
            conn.execute(sql.SQL("drop role {}").format(sql.Identifier(name)))
