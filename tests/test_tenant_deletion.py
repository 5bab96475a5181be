"""`agentkeel tenant delete` (G10) as an operator runs it: dry run, confirmation, steps,
JSON, an interrupted run resumed, clear refusals; and keel.delete_tenant on the Citus
cluster, where one tenant's deletion leaves every other tenant's rows as they were."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

import citus_cluster
from agentkeel.checkpoints import (
    CheckpointUnreadable,
    KeyringKeyProvider,
    StaticKeyProvider,
    data_key_context,
)
from agentkeel.client import Keel
from agentkeel.embedded import find_bindir
from agentkeel.errors import TenantDeleted
from agentkeel_conformance.harness import in_tenant, tenant_snapshot
from agentkeel_conformance.tenant_fill import fill_tenant
from conftest import AGENTKEEL, run_agentkeel, temporary_login

WORKFLOW = [("queued", "running"), ("running", "done")]


def filled(dsn: str, tasks: int = 2) -> uuid.UUID:
    with psycopg.connect(dsn, autocommit=True) as conn:
        keel = Keel(conn)
        keel.define_workflow("deletion", 1, "queued", WORKFLOW)
        tenant = keel.create_tenant("doomed").tenant_id
        fill_tenant(conn, tenant, "deletion", tasks)
    return tenant


def deletion_record(dsn: str, tenant: uuid.UUID) -> tuple[object, ...] | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "select events, finished_at is not null from keel.tenant_deletions"
            " where deleted_tenant_id = %s",
            (tenant,),
        ).fetchone()


def test_dry_run_counts_and_a_run_without_yes_and_without_a_terminal_changes_nothing(
    migrated_db,
):
    tenant = filled(migrated_db)
    dry = run_agentkeel("tenant", "delete", "--dsn", migrated_db, str(tenant), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "keel.task_events" in dry.stdout and "would be removed (--dry-run)" in dry.stdout
    as_json = run_agentkeel(
        "tenant", "delete", "--dsn", migrated_db, str(tenant), "--dry-run", "--format", "json"
    )
    rows = json.loads(as_json.stdout)["rows"]
    assert rows["keel.tasks"] == 2 and rows["keel.tenants"] == 1 and rows["keel.task_events"] == 6
    refused = run_agentkeel("tenant", "delete", "--dsn", migrated_db, str(tenant))
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        "agentkeel: error: `agentkeel tenant delete` deletes for good: pass --yes"
    )
    assert deletion_record(migrated_db, tenant) is None


def test_a_deletion_runs_in_steps_reports_per_table_and_runs_again_as_a_no_op(migrated_db):
    tenant = filled(migrated_db)
    done = run_agentkeel(
        "tenant", "delete", "--dsn", migrated_db, str(tenant), "--yes", "--batch", "3"
    )
    assert done.returncode == 0, done.stderr
    assert "keel.checkpoint_payloads" in done.stdout and "2 removed" in done.stdout
    assert "1 data key(s) destroyed, 6 event tombstone(s) kept" in done.stdout
    assert deletion_record(migrated_db, tenant) == ("tombstone", True)
    again = run_agentkeel(
        "tenant", "delete", "--dsn", migrated_db, str(tenant), "--yes", "--format", "json"
    )
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["finished"] is True and report["removed"] == {}
    assert report["tombstones"] == 6 and report["data_keys_destroyed"] == 1


def test_refusals_are_one_line_with_their_exit_code(migrated_db):
    unknown = run_agentkeel("tenant", "delete", "--dsn", migrated_db, str(uuid.uuid4()), "--yes")
    assert unknown.returncode == 4
    assert unknown.stderr.startswith("agentkeel: error: database error 42K02: no tenant")
    assert len(unknown.stderr.strip().splitlines()) == 1
    tenant = filled(migrated_db)
    with temporary_login(migrated_db, "keel_app") as app:
        denied = run_agentkeel("tenant", "delete", "--dsn", app, str(tenant), "--yes")
    assert denied.returncode == 7, denied.stderr
    assert denied.stderr.startswith("agentkeel: error: permission denied")
    bad = run_agentkeel("tenant", "delete", "--dsn", migrated_db, "not-a-uuid", "--yes")
    assert bad.returncode == 2
    assert deletion_record(migrated_db, tenant) is None


def test_an_interrupted_run_is_resumed_by_running_it_again(migrated_db):
    """Ctrl-C after the deletion began: exit 130, the steps done stay done; the same
    command again finishes it, and the record counts every row once."""
    tenant = filled(migrated_db, tasks=1)
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        keel = Keel(conn)
        for _ in range(300):
            keel.create_task(tenant, "deletion", 1)
    proc = subprocess.Popen(
        [
            *AGENTKEEL,
            "tenant",
            "delete",
            "--dsn",
            migrated_db,
            str(tenant),
            "--yes",
            "--batch",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while deletion_record(migrated_db, tenant) is None and proc.poll() is None:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert deletion_record(migrated_db, tenant) == ("tombstone", False)
    resumed = run_agentkeel(
        "tenant", "delete", "--dsn", migrated_db, str(tenant), "--yes", "--format", "json"
    )
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["finished"] is True
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        ((removed,),) = conn.execute(
            "select removed from keel.tenant_deletions where deleted_tenant_id = %s", (tenant,)
        ).fetchall()
    assert removed["keel.tasks"] == 301 and removed["keel.tenants"] == 1


@pytest.fixture(scope="module")
def citus_deletion_db(citus_admin_dsn: str) -> Iterator[str]:
    with citus_cluster.fresh_database(citus_admin_dsn) as dsn:
        citus_cluster.migrate_and_distribute(dsn)
        yield dsn


@pytest.mark.citus
def test_on_citus_a_deletion_removes_the_tenant_and_no_other_tenants_row(citus_deletion_db):
    """Four tenants on the cluster (so both workers hold some); one is deleted with the
    CLI in steps of 4 rows: none of its rows is left, its events are tombstones on the
    coordinator, it is refused afterwards, and the other three tenants' rows are exactly
    as they were."""
    dsn = citus_deletion_db
    tenants = [filled(dsn) for _ in range(4)]
    doomed, others = tenants[0], tenants[1:]
    with psycopg.connect(dsn, autocommit=True) as owner:
        before = {t: tenant_snapshot(owner, t) for t in others}
    done = run_agentkeel("tenant", "delete", "--dsn", dsn, str(doomed), "--yes", "--batch", "4")
    assert done.returncode == 0, done.stderr
    assert deletion_record(dsn, doomed) == ("tombstone", True)
    with psycopg.connect(dsn, autocommit=True) as owner:
        with in_tenant(owner, doomed):
            left = owner.execute("select * from keel.tenant_rows(%s)", (doomed,)).fetchall()
        assert all(count == 0 for _, count in left), left
        ((kept,),) = owner.execute(
            "select count(*) from keel.task_event_tombstones where deleted_tenant_id = %s",
            (doomed,),
        ).fetchall()
        assert kept == 6
        for t in others:
            assert tenant_snapshot(owner, t) == before[t]
        with pytest.raises(TenantDeleted):
            Keel(owner).create_tenant("again", doomed)


def dump_tools(dsn: str) -> Path:
    """The folder of a pg_dump and pg_restore of the server's own major version."""
    with psycopg.connect(dsn) as conn:
        major = conn.info.server_version // 10000
    for folder in (Path(f"/usr/lib/postgresql/{major}/bin"), find_bindir()):
        dump = folder / "pg_dump"
        if dump.exists() and (folder / "pg_restore").exists():
            version = subprocess.run(
                [dump, "--version"], capture_output=True, text=True, check=True
            ).stdout
            if f" {major}." in version:
                return folder
    pytest.skip(f"no pg_dump and pg_restore of PostgreSQL {major} on this machine")


def test_a_backup_from_before_the_deletion_cannot_be_read_when_the_keyring_key_is_gone(
    migrated_db, make_db, tmp_path
):
    """Crypto-shredding reaches copies only if the wrapping key goes too. A checkpoint of
    a tenant whose data key is wrapped by a keyring key of its own, and one of a tenant
    whose data key is wrapped by one key shared by all: a pg_dump is taken, both tenants
    are deleted (the first with --keyring), the dump is restored into a new database.
    There the first checkpoint does not decrypt; the second still does, which is why the
    docs tell deployments that must reach backups to use a key per tenant."""
    tools = dump_tools(migrated_db)
    keyring = KeyringKeyProvider(tmp_path / "keyring")
    shared = StaticKeyProvider(os.urandom(32))
    saved: dict[str, tuple[uuid.UUID, uuid.UUID]] = {}
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        Keel(conn).define_workflow("deletion", 1, "queued", WORKFLOW)
        for name, provider in (("keyring", keyring), ("shared", shared)):
            keel = Keel(conn, key_provider=provider)
            tenant = keel.create_tenant(name).tenant_id
            task = keel.create_task(tenant, "deletion", 1)
            token = keel.claim_lease(tenant, task.task_id, "w", timedelta(minutes=5)).fencing_token
            keel.save_checkpoint(tenant, task.task_id, token, "INPUT", {"who": name})
            saved[name] = (tenant, task.task_id)
    dump = tmp_path / "before.dump"
    subprocess.run(
        [tools / "pg_dump", "-Fc", "-f", dump, "--dbname", migrated_db], check=True, timeout=300
    )
    gone = run_agentkeel(
        "tenant",
        "delete",
        "--dsn",
        migrated_db,
        str(saved["keyring"][0]),
        "--yes",
        "--keyring",
        str(tmp_path / "keyring"),
    )
    assert gone.returncode == 0, gone.stderr
    assert f"keyring key of tenant {saved['keyring'][0]}: destroyed" in gone.stdout
    typo = run_agentkeel(
        "tenant", "delete", "--dsn", migrated_db, str(saved["shared"][0]), "--yes",
        "--keyring", str(tmp_path / "keyrnig"),
    )  # fmt: skip
    assert typo.returncode == 2 and "not a checkpoint keyring" in typo.stderr
    other = run_agentkeel(
        "tenant", "delete", "--dsn", migrated_db, str(saved["shared"][0]), "--yes",
        "--keyring", str(tmp_path / "keyring"),
    )  # fmt: skip
    assert other.returncode == 3 and "were wrapped by aes256gcm:" in other.stderr
    assert deletion_record(migrated_db, saved["shared"][0]) is None
    also = run_agentkeel("tenant", "delete", "--dsn", migrated_db, str(saved["shared"][0]), "--yes")
    assert also.returncode == 0, also.stderr

    restored = make_db()
    subprocess.run(
        [tools / "pg_restore", "--exit-on-error", "--dbname", restored, dump],
        check=True,
        timeout=300,
    )
    with psycopg.connect(restored, autocommit=True) as conn:
        tenant, task_id = saved["keyring"]
        with pytest.raises(CheckpointUnreadable, match="not in the keyring"):
            Keel(conn, key_provider=keyring).load_latest_checkpoint(tenant, task_id)
        tenant, task_id = saved["shared"]
        copy = Keel(conn, key_provider=shared).load_latest_checkpoint(tenant, task_id)
        assert copy is not None and copy.payload == {"who": "shared"}


def test_the_keyring_keeps_a_key_per_tenant_private_and_made_once(tmp_path):
    keyring = KeyringKeyProvider(tmp_path / "keyring")
    again = KeyringKeyProvider(tmp_path / "keyring")
    a, b = uuid.uuid4(), uuid.uuid4()
    data_key = os.urandom(32)
    wrapped = keyring.wrap(data_key, data_key_context(a))
    assert again.key_id == keyring.key_id and again.unwrap(wrapped, data_key_context(a)) == data_key
    with pytest.raises(CheckpointUnreadable):
        keyring.unwrap(wrapped, data_key_context(b))  # b has no key: none is made to unwrap
    assert not (tmp_path / "keyring" / f"{b}.key").exists()  # an unwrap never makes a key
    assert oct((tmp_path / "keyring" / f"{a}.key").stat().st_mode & 0o777) == "0o600"
    assert keyring.destroy_tenant(a) and not keyring.destroy_tenant(a)
    with pytest.raises(CheckpointUnreadable, match="not in the keyring"):
        again.unwrap(wrapped, data_key_context(a))
    key_file = tmp_path / "keyring" / f"{b}.key"
    keyring.wrap(data_key, data_key_context(b))
    key_file.chmod(0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        keyring.wrap(data_key, data_key_context(b))
    key_file.unlink()
    key_file.symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").write_text("0" * 64)
    with pytest.raises(OSError):
        keyring.destroy_tenant(b)  # never writes through a link
    assert (tmp_path / "elsewhere").read_text() == "0" * 64
    with pytest.raises(ValueError, match="not a checkpoint keyring"):
        KeyringKeyProvider(tmp_path / "no-such-keyring", create=False)
    (tmp_path / "open").mkdir(mode=0o755)
    (tmp_path / "open").chmod(0o755)
    with pytest.raises(ValueError, match="chmod 700"):
        KeyringKeyProvider(tmp_path / "open")
