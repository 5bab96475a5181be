"""`agentkeel purge` (G11) as an operator runs it: a dry run, a round over every tenant
or the ones named, JSON, a loop stopped by SIGTERM, one-line refusals; and keel.purge on
the Citus cluster."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest

import citus_cluster
from agentkeel.client import Keel
from agentkeel_conformance.harness import in_tenant
from agentkeel_conformance.tenant_fill import fill_tenant
from conftest import AGENTKEEL, run_agentkeel, temporary_login

WORKFLOW = [("queued", "running"), ("running", "done")]
SETTINGS = (
    "retain_finished_tasks",
    "retain_closed_sessions",
    "retain_old_checkpoints",
    "retain_delivered_messages",
    "retain_dead_messages",
    "retain_inbox",
)


def finished_tenant(dsn: str, tasks: int = 2, retain: str | None = "0") -> uuid.UUID:
    """A tenant whose tasks are done and whose messages are delivered; with retain set,
    every retention period of it is that."""
    topic = f"purge.{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        keel = Keel(conn)
        keel.define_workflow("purge", 1, "queued", WORKFLOW)
        tenant = keel.create_tenant("purged").tenant_id
        fill_tenant(conn, tenant, "purge", tasks, topic=topic)
        while claimed := keel.claim_outbox("purge-test", 100, topic_prefix=topic):
            for m in claimed:
                keel.ack_outbox(m.tenant_id, m.message_id, m.claim_token)
        if retain is not None:
            for setting in SETTINGS:
                conn.execute(
                    "select keel.set_tenant_retention(%s, %s, %s)", (tenant, setting, retain)
                )
    return tenant


def tasks_of(dsn: str, tenant: uuid.UUID) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn, in_tenant(conn, tenant):
        row = conn.execute("select count(*) from keel.tasks where tenant_id = %s", (tenant,))
        return int(row.fetchone()[0])  # type: ignore[index]


def checkpoint_bytes(dsn: str, tenant: uuid.UUID) -> tuple[int, int]:
    """The tenant's checkpoint bytes as its quota counts them (keel.tenant_quota_status:
    the counter less the purges' credits) and what its payloads hold."""
    with psycopg.connect(dsn, autocommit=True) as conn, in_tenant(conn, tenant):
        counted = conn.execute(
            "select used from keel.tenant_quota_status(%s)"
            " where setting = 'max_tenant_checkpoint_bytes'",
            (tenant,),
        ).fetchone()
        held = conn.execute(
            "select coalesce(sum(octet_length(ciphertext)), 0)::bigint"
            " from keel.checkpoint_payloads where tenant_id = %s",
            (tenant,),
        ).fetchone()
        assert counted is not None and held is not None
        return int(counted[0]), int(held[0])


def test_a_dry_run_counts_and_a_round_purges_only_what_is_due(migrated_db):
    due, kept = finished_tenant(migrated_db), finished_tenant(migrated_db, retain=None)
    dry = run_agentkeel("purge", "--dsn", migrated_db, "--dry-run", "--format", "json")
    assert dry.returncode == 0, dry.stderr
    report = json.loads(dry.stdout)
    assert report["dry_run"] and report["tenants"] == 2
    assert report["kinds"]["delivered_messages"] == 2 and report["kinds"]["inbox"] == 1
    assert tasks_of(migrated_db, due) == 2
    done = run_agentkeel("purge", "--dsn", migrated_db, "--batch", "3")
    assert done.returncode == 0, done.stderr
    assert "purged in 2 tenant(s)" in done.stdout
    assert "finished_tasks" in done.stdout and "delivered_messages 2" in done.stdout
    assert tasks_of(migrated_db, due) == 0 and tasks_of(migrated_db, kept) == 2
    again = run_agentkeel("purge", "--dsn", migrated_db, "--format", "json")
    assert json.loads(again.stdout)["relations"] == {}


def test_a_named_tenant_alone_is_purged(migrated_db):
    one, other = finished_tenant(migrated_db), finished_tenant(migrated_db)
    done = run_agentkeel("purge", "--dsn", migrated_db, "--tenant", str(one), "--format", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["tenants"] == 1
    assert tasks_of(migrated_db, one) == 0 and tasks_of(migrated_db, other) == 2


def test_the_loop_purges_what_comes_due_and_stops_on_sigterm(migrated_db):
    proc = subprocess.Popen(
        [*AGENTKEEL, "purge", "--dsn", migrated_db, "--interval", "0.2", "--format", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        tenant = finished_tenant(migrated_db)
        while tasks_of(migrated_db, tenant) and proc.poll() is None:
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert tasks_of(migrated_db, tenant) == 0
    rounds = [json.loads(line) for line in stdout.splitlines()]
    assert any(r["kinds"].get("finished_tasks") for r in rounds), stdout
    assert proc.returncode in (0, 130, 143), stderr


def test_refusals_are_one_line_with_their_exit_code(migrated_db):
    tenant = finished_tenant(migrated_db)
    with temporary_login(migrated_db, "keel_app") as app:
        denied = run_agentkeel("purge", "--dsn", app)
    assert denied.returncode == 7, denied.stderr
    assert denied.stderr.startswith("agentkeel: error: permission denied")
    both = run_agentkeel("purge", "--dsn", migrated_db, "--once", "--interval", "1")
    assert both.returncode == 2
    assert tasks_of(migrated_db, tenant) == 2


def test_a_tenant_the_database_refuses_does_not_stop_the_round(migrated_db):
    """The nil uuid (refused, 22K01) named before a real tenant: the real one is purged,
    the refusal is one line naming the tenant, and the round exits 4."""
    tenant = finished_tenant(migrated_db)
    nil = str(uuid.UUID(int=0))
    both = run_agentkeel("purge", "--dsn", migrated_db, "--tenant", nil, "--tenant", str(tenant))
    assert both.returncode == 4
    assert both.stderr.splitlines() == [
        f"agentkeel: tenant {nil} not purged: 22K01: a tenant id (not the nil uuid) is required",
        "agentkeel: error: 1 tenant(s) not purged (above)",
    ]
    assert tasks_of(migrated_db, tenant) == 0


@pytest.fixture(scope="module")
def citus_purge_db(citus_admin_dsn: str) -> Iterator[str]:
    with citus_cluster.fresh_database(citus_admin_dsn) as dsn:
        citus_cluster.migrate_and_distribute(dsn)
        yield dsn


@pytest.mark.citus
def test_on_citus_the_purge_removes_what_is_due_and_keeps_the_rest(citus_purge_db):
    """Four tenants on the cluster, two with every period 0: a purge round in steps of
    three removes their finished tasks and all they own, and nothing of the other two; the
    purged tenants' checkpoint bytes are credited back (0 counted), the others' stay what
    they hold."""
    dsn = citus_purge_db
    due = [finished_tenant(dsn) for _ in range(2)]
    kept = [finished_tenant(dsn, retain=None) for _ in range(2)]
    done = run_agentkeel("purge", "--dsn", dsn, "--batch", "3", "--format", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["relations"]["keel.tasks"] == 4 and report["relations"]["keel.task_events"] == 12
    assert [tasks_of(dsn, t) for t in due + kept] == [0, 0, 2, 2]
    assert [checkpoint_bytes(dsn, t) for t in due] == [(0, 0), (0, 0)]
    for tenant in kept:
        counted, held = checkpoint_bytes(dsn, tenant)
        assert counted == held > 0
