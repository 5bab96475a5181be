"""The migrator (G12): idempotent, refuses drift and newer databases, serializes, plans."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from agentkeel.exitcodes import ExitCode
from agentkeel.migrate import LOCK_KEY, MARKER, SourceError, load_sources, migrate_up
from agentkeel.sql_files import sql_root
from catalog import differences, snapshot
from conftest import AGENTKEEL, run_agentkeel, temporary_login


def history(dsn: str) -> dict[str, str]:
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute("select name, checksum from keel.migration_history").fetchall())


def test_up_applies_everything_once_and_then_has_nothing_to_do(db):
    first = run_agentkeel("migrate", "up", "--dsn", db)
    assert first.returncode == 0, first.stderr
    sources = load_sources(sql_root())
    assert f"{len(sources)} files applied" in first.stdout
    assert history(db) == {m.name: m.checksum for m in sources}
    second = run_agentkeel("migrate", "up", "--dsn", db)
    assert second.returncode == 0, second.stderr
    assert "nothing to do" in second.stdout
    assert "applied schema" not in second.stdout
    assert run_agentkeel("migrate", "validate", "--dsn", db).returncode == 0


def test_validate_and_status_report_pending_migrations(db):
    result = run_agentkeel("migrate", "validate", "--dsn", db)
    assert result.returncode == 1
    assert "schema/0001_keel_schema.sql" in result.stderr
    status = run_agentkeel("migrate", "status", "--dsn", db)
    assert status.returncode == 0
    assert "pending" in status.stdout


def test_an_edited_applied_migration_is_refused_as_drift(db, sql_tree):
    assert run_agentkeel("migrate", "up", "--dsn", db, "--sql-dir", str(sql_tree)).returncode == 0
    target = sql_tree / "schema" / "0003_tenants.sql"
    target.write_text(target.read_text() + "\n-- an innocent-looking edit\n")
    before = history(db)

    validate = run_agentkeel("migrate", "validate", "--dsn", db, "--sql-dir", str(sql_tree))
    assert validate.returncode == 3
    assert "drift: schema/0003_tenants.sql" in validate.stderr

    (sql_tree / "schema" / "9010_more.sql").write_text("create table keel.more (id int);\n")
    up = run_agentkeel("migrate", "up", "--dsn", db, "--sql-dir", str(sql_tree))
    assert up.returncode == 3
    assert "schema/0003_tenants.sql" in up.stderr
    assert history(db) == before  # nothing else was applied either


def test_a_changed_function_file_is_reapplied_alone(db, sql_tree):
    assert run_agentkeel("migrate", "up", "--dsn", db, "--sql-dir", str(sql_tree)).returncode == 0
    target = sql_tree / "functions" / "error_codes.sql"
    target.write_text(target.read_text() + "\n-- edit\n")
    status = run_agentkeel("migrate", "status", "--dsn", db, "--sql-dir", str(sql_tree))
    assert "changed" in status.stdout
    up = run_agentkeel("migrate", "up", "--dsn", db, "--sql-dir", str(sql_tree))
    assert up.returncode == 0, up.stderr
    applied = [line.split()[1] for line in up.stdout.splitlines() if line.startswith("applied ")]
    policies = sorted(p.name for p in (sql_tree / "policies").glob("*.sql"))
    assert applied == ["functions/error_codes.sql"] + [f"policies/{p}" for p in policies]


def test_a_database_newer_than_the_code_is_refused(db, sql_tree):
    (sql_tree / "schema" / "9099_future.sql").write_text("create table keel.future (id int);\n")
    assert run_agentkeel("migrate", "up", "--dsn", db, "--sql-dir", str(sql_tree)).returncode == 0
    result = run_agentkeel("migrate", "up", "--dsn", db)  # the shipped files lack 0099
    assert result.returncode == 3
    assert "newer database: schema/9099_future.sql" in result.stderr


def test_a_pending_migration_older_than_an_applied_one_is_refused(db, sql_tree):
    (sql_tree / "schema" / "9011_later.sql").write_text("create table keel.later (id int);\n")
    assert run_agentkeel("migrate", "up", "--dsn", db, "--sql-dir", str(sql_tree)).returncode == 0
    (sql_tree / "schema" / "9010_earlier.sql").write_text("create table keel.earlier (id int);\n")
    result = run_agentkeel("migrate", "up", "--dsn", db, "--sql-dir", str(sql_tree))
    assert result.returncode == 3
    assert "out of order: schema/9010_earlier.sql" in result.stderr


def test_two_migrators_started_together_serialize(db):
    procs = [
        subprocess.Popen(
            [*AGENTKEEL, "migrate", "up", "--dsn", db],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    stdouts = sorted(out for out, _ in outputs)
    assert sum("nothing to do" in out for out in stdouts) == 1
    assert sum("applied schema/0001_keel_schema.sql" in out for out in stdouts) == 1
    assert len(history(db)) == len(load_sources(sql_root()))


def test_a_held_migration_lock_times_out_with_a_clear_message(db):
    with psycopg.connect(db, autocommit=True) as holder:
        holder.execute("select pg_advisory_lock(%s)", (LOCK_KEY,))
        pid = holder.info.backend_pid
        result = run_agentkeel("migrate", "up", "--dsn", db, "--lock-wait", "1")
    assert result.returncode == 4
    assert f"waiting for another migrator (backend pid {pid})" in result.stderr
    assert "nothing was applied" in result.stderr


def test_an_application_login_cannot_hold_the_migrators_off(migrated_db, sql_tree):
    """Migrators used to serialize on an advisory lock, which any role may take on any key:
    an agent holding that key blocked every `migrate up`. Now they lock
    keel.migration_history, which no application role may lock, and ignore the key and the
    no-transaction marker when a role outside keel_owner holds them."""
    (sql_tree / "schema" / "9001_notes.sql").write_text("create table keel.notes (id int);\n")
    with (
        temporary_login(migrated_db, "keel_agent") as agent_dsn,
        psycopg.connect(agent_dsn, autocommit=True) as agent,
    ):
        agent.execute("select pg_advisory_lock(%s)", (LOCK_KEY,))
        agent.execute("select set_config('application_name', %s, false)", (MARKER,))
        with pytest.raises(psycopg.errors.InsufficientPrivilege), agent.transaction():
            agent.execute("lock table keel.migration_history in share update exclusive mode")
        result = run_agentkeel(
            "migrate", "up", "--dsn", migrated_db, "--sql-dir", str(sql_tree), "--lock-wait", "2"
        )
        assert result.returncode == 0, result.stderr
        assert "applied schema/9001_notes.sql" in result.stdout
        assert "waiting" not in result.stderr


def test_a_migrator_running_no_transaction_files_keeps_the_next_one_out(migrated_db, sql_tree):
    """While one migrator runs a no-transaction file (here held on a lock this test
    holds), the table lock is free; its marker keeps a second migrator waiting."""
    (sql_tree / "schema" / "9010_held.sql").write_text(
        "-- agentkeel:no-transaction\n"
        "select pg_advisory_lock(4242);\n"
        "select pg_advisory_unlock(4242);\n"
    )
    args = ("--dsn", migrated_db, "--sql-dir", str(sql_tree))
    with psycopg.connect(migrated_db, autocommit=True) as holder:
        holder.execute("select pg_advisory_lock(4242)")
        first = subprocess.Popen(
            [*AGENTKEEL, "migrate", "up", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            pid = None
            deadline = time.monotonic() + 120
            while pid is None and first.poll() is None and time.monotonic() < deadline:
                row = holder.execute(
                    "select pid from pg_stat_activity where application_name = %s"
                    " and wait_event_type = 'Lock' and datname = current_database()",
                    (MARKER,),
                ).fetchone()
                pid = row[0] if row else None
                time.sleep(0.1)
            assert pid is not None, "the first migrator never waited in its no-transaction file"
            second = run_agentkeel("migrate", "up", *args, "--lock-wait", "1")
            assert second.returncode == 4, second.stdout + second.stderr
            assert f"another migrator (backend pid {pid})" in second.stderr
            assert "nothing was applied" in second.stderr
        finally:
            holder.execute("select pg_advisory_unlock(4242)")
            out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert "applied schema/9010_held.sql" in out
    assert run_agentkeel("migrate", "up", *args).stdout.strip().endswith("up to date")


def test_lock_timeout_stops_a_migration_that_would_queue_behind_a_lock(migrated_db, sql_tree):
    (sql_tree / "schema" / "9010_add_column.sql").write_text(
        "alter table keel.tenants add column note text;\n"
    )
    with psycopg.connect(migrated_db) as blocker:
        blocker.execute("lock table keel.tenants in access share mode")
        result = run_agentkeel(
            "migrate",
            "up",
            "--dsn",
            migrated_db,
            "--sql-dir",
            str(sql_tree),
            "--lock-timeout",
            "300ms",
        )
        blocker.rollback()
    assert result.returncode == 4
    assert "schema/9010_add_column.sql failed" in result.stderr
    assert "lock_timeout expired" in result.stderr
    assert "schema/9010_add_column.sql" not in history(migrated_db)


def test_a_failing_migration_is_rolled_back_and_not_recorded(migrated_db, sql_tree):
    (sql_tree / "schema" / "9010_broken.sql").write_text(
        "create table keel.half_done (id int);\nselect 1 / 0;\n"
    )
    result = run_agentkeel("migrate", "up", "--dsn", migrated_db, "--sql-dir", str(sql_tree))
    assert result.returncode == 4
    assert "schema/9010_broken.sql failed at `select 1 / 0`" in result.stderr
    with psycopg.connect(migrated_db) as conn:
        assert conn.execute("select to_regclass('keel.half_done')").fetchone() == (None,)
    assert "schema/9010_broken.sql" not in history(migrated_db)


def test_a_non_transactional_migration_runs_statement_by_statement(migrated_db, sql_tree):
    (sql_tree / "schema" / "9010_concurrent_index.sql").write_text(
        "-- agentkeel:no-transaction\n"
        "create index concurrently if not exists tenants_name_idx on keel.tenants (name);\n"
    )
    result = run_agentkeel("migrate", "up", "--dsn", migrated_db, "--sql-dir", str(sql_tree))
    assert result.returncode == 0, result.stderr
    with psycopg.connect(migrated_db) as conn:
        assert conn.execute("select to_regclass('keel.tenants_name_idx')").fetchone()[0] is not None


def full_history(dsn: str) -> set[tuple[object, ...]]:
    """Every column of the history except timing and who/when."""
    with psycopg.connect(dsn) as conn:
        return set(
            conn.execute(
                "select name, kind, version, checksum, agentkeel_version"
                " from keel.migration_history"
            ).fetchall()
        )


def psql(dsn: str, script: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("psql") is None:
        pytest.skip("psql is not installed: the plan was printed but not replayed")
    return subprocess.run(
        ["psql", "-X", "-v", "ON_ERROR_STOP=1", "-q", dsn],
        input=script,
        text=True,
        capture_output=True,
        check=False,
    )


def test_plan_prints_sql_that_psql_can_apply(db, make_db):
    migrated_db = make_db()
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        migrate_up(conn, sql_root())
    plan = run_agentkeel("migrate", "plan", "--dsn", db)
    assert plan.returncode == 0, plan.stderr
    assert "-- schema/0001_keel_schema.sql" in plan.stdout
    assert run_agentkeel("migrate", "plan", "--dsn", migrated_db).stdout.count("-- schema/") == 0
    applied = psql(db, plan.stdout)
    assert applied.returncode == 0, applied.stderr
    assert run_agentkeel("migrate", "validate", "--dsn", db).returncode == 0
    assert full_history(db) == full_history(migrated_db)
    with psycopg.connect(db) as a, psycopg.connect(migrated_db) as b:
        assert differences(snapshot(a), snapshot(b)) == []


def test_a_replayed_plan_records_the_history_up_records(make_db, sql_tree):
    """`plan` and `up` come from one list of steps: on a database where every row exists
    already (re-applied files update them) and with a no-transaction file, a psql replay
    of the plan leaves the same history as `up`."""
    by_up, by_plan = make_db(), make_db()
    for dsn in (by_up, by_plan):
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate_up(conn, sql_tree)
            conn.execute(
                "update keel.migration_history set agentkeel_version = '0.0.0-old',"
                " execution_ms = -1"
            )
    target = sql_tree / "functions" / "error_codes.sql"
    target.write_text(target.read_text() + "\n-- edit\n")
    (sql_tree / "schema" / "9010_tenant_name_index.sql").write_text(
        "-- agentkeel:no-transaction\n"
        "create index concurrently if not exists tenants_name_idx on keel.tenants (name);\n"
    )
    args = ("--sql-dir", str(sql_tree), "--lock-timeout", "3s")
    up = run_agentkeel("migrate", "up", "--dsn", by_up, *args)
    assert up.returncode == 0, up.stderr
    plan = run_agentkeel("migrate", "plan", "--dsn", by_plan, *args)
    assert plan.returncode == 0, plan.stderr
    # The no-transaction file runs under the same lock_timeout and search_path as the others.
    nt_part = plan.stdout.split("-- schema/9010_tenant_name_index.sql (")[1]
    assert nt_part.index("set lock_timeout = '3s'") < nt_part.index("create index concurrently")
    applied = psql(by_plan, plan.stdout)
    assert applied.returncode == 0, applied.stderr
    assert full_history(by_plan) == full_history(by_up)
    assert ("schema/9010_tenant_name_index.sql", "versioned", 9010) in {
        row[:3] for row in full_history(by_plan)
    }
    with psycopg.connect(by_plan) as conn:
        rows = conn.execute(
            "select name, execution_ms from keel.migration_history"
            " where name like 'policies/%' or name like 'functions/error_codes%'"
            " or name like 'schema/9010%'"
        ).fetchall()
    assert rows and all(ms >= 0 for _, ms in rows), rows  # re-recorded with their own timing
    with psycopg.connect(by_up) as a, psycopg.connect(by_plan) as b:
        assert differences(snapshot(a), snapshot(b)) == []


def test_badly_named_migration_files_are_refused_before_connecting(sql_tree):
    (sql_tree / "schema" / "10-Add Things.sql").write_text("select 1;\n")
    result = run_agentkeel(
        "migrate", "up", "--dsn", "postgresql://nobody@127.0.0.1:1/none", "--sql-dir", str(sql_tree)
    )
    assert result.returncode == 2
    assert "NNNN_lower_snake.sql" in result.stderr


def test_an_unreachable_database_is_one_line_and_the_connection_code():
    result = run_agentkeel("migrate", "status", "--dsn", "postgresql://nobody@127.0.0.1:1/none")
    assert result.returncode == ExitCode.CONNECTION
    assert result.stderr.startswith("agentkeel: error: cannot connect to the --dsn database")
    assert len(result.stderr.strip().splitlines()) == 1


def test_migrate_up_needs_an_autocommit_connection(db):
    with psycopg.connect(db) as conn, pytest.raises(ValueError, match="autocommit"):
        migrate_up(conn, sql_root())


def test_checksums_ignore_line_endings(sql_tree: Path):
    target = sql_tree / "schema" / "0003_tenants.sql"
    before = {m.name: m.checksum for m in load_sources(sql_tree)}
    target.write_bytes(target.read_bytes().replace(b"\n", b"\r\n"))
    assert {m.name: m.checksum for m in load_sources(sql_tree)} == before


def test_repeatable_files_run_after_the_files_they_require(sql_tree: Path):
    (sql_tree / "functions" / "aaa_first_by_name.sql").write_text(
        "-- agentkeel:requires functions/zzz_dependency.sql\nselect 1;\n"
    )
    (sql_tree / "functions" / "zzz_dependency.sql").write_text("select 2;\n")
    names = [m.name for m in load_sources(sql_tree)]
    assert names.index("functions/zzz_dependency.sql") < names.index(
        "functions/aaa_first_by_name.sql"
    )


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"a.sql": "-- agentkeel:requires functions/nope.sql\n"}, "not an earlier file"),
        (
            {
                "a.sql": "-- agentkeel:requires functions/b.sql\n",
                "b.sql": "-- agentkeel:requires functions/a.sql\n",
            },
            "cycle",
        ),
    ],
)
def test_broken_requirements_are_refused(sql_tree: Path, files, message):
    for name, text in files.items():
        (sql_tree / "functions" / name).write_text(text + "select 1;\n")
    with pytest.raises(SourceError, match=message):
        load_sources(sql_tree)


def catalog_state(dsn: str) -> tuple[object, ...]:
    """The keel catalog, the whole history table, and whether the schema exists at all."""
    with psycopg.connect(dsn) as conn:
        has_history = conn.execute(
            "select to_regclass('keel.migration_history') is not null"
        ).fetchone()
        rows = (
            conn.execute("select * from keel.migration_history order by name").fetchall()
            if has_history and has_history[0]
            else []
        )
        schema = conn.execute("select to_regnamespace('keel') is not null").fetchone()
        catalog = snapshot(conn) if schema and schema[0] else None
        return catalog, rows, schema


def test_serial_and_identity_columns_apply(migrated_db, sql_tree):
    (sql_tree / "schema" / "9010_notes.sql").write_text(
        "create table keel.notes (id bigserial primary key, tenant_id uuid not null, body text);\n"
    )
    (sql_tree / "schema" / "9011_labels.sql").write_text(
        "create table keel.labels (\n"
        "    id bigint generated always as identity primary key, tenant_id uuid not null\n"
        ");\n"
    )
    result = run_agentkeel("migrate", "up", "--dsn", migrated_db, "--sql-dir", str(sql_tree))
    assert result.returncode == 0, result.stderr
    with psycopg.connect(migrated_db) as conn:
        owners = conn.execute(
            "select c.relname, pg_get_userbyid(c.relowner), c.relrowsecurity,"
            " c.relforcerowsecurity from pg_class c"
            " where c.relnamespace = 'keel'::regnamespace"
            " and c.relname in ('notes', 'notes_id_seq', 'labels', 'labels_id_seq')"
            " order by 1"
        ).fetchall()
    assert owners == [
        ("labels", "keel_owner", True, True),
        ("labels_id_seq", "keel_owner", False, False),
        ("notes", "keel_owner", True, True),
        ("notes_id_seq", "keel_owner", False, False),
    ]


@pytest.mark.parametrize("start", ["migrated", "fresh"])
def test_a_failing_policy_file_leaves_the_database_as_it_was(make_db, sql_tree, start):
    dsn = make_db()
    if start == "migrated":
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate_up(conn, sql_tree)
    (sql_tree / "schema" / "9010_notes.sql").write_text(
        "create table keel.notes (id uuid primary key, tenant_id uuid not null);\n"
    )
    (sql_tree / "policies" / "07_broken.sql").write_text("select 1 / 0;\n")
    before = catalog_state(dsn)
    result = run_agentkeel("migrate", "up", "--dsn", dsn, "--sql-dir", str(sql_tree))
    assert result.returncode == 4
    assert "policies/07_broken.sql failed at `select 1 / 0`" in result.stderr
    assert "rolled back" in result.stderr
    assert catalog_state(dsn) == before


def test_no_transaction_files_run_after_the_transaction_and_are_retried(migrated_db, sql_tree):
    """A no-transaction file runs after the run's transaction has committed (so it may use
    what later files create); when it fails, the rest stays applied with its policies, and
    the next run applies it although a later version is applied (not "out of order")."""
    (sql_tree / "schema" / "9010_notes_index.sql").write_text(
        "-- agentkeel:no-transaction\n"
        "create index concurrently notes_body_idx on keel.notes (body);\n"
        "select 1 / 0;\n"
    )
    (sql_tree / "schema" / "9011_notes.sql").write_text(
        "create table keel.notes (id uuid primary key, tenant_id uuid not null, body text);\n"
    )
    args = ("--dsn", migrated_db, "--sql-dir", str(sql_tree))
    failed = run_agentkeel("migrate", "up", *args)
    assert failed.returncode == 4
    assert "schema/9010_notes_index.sql failed at `select 1 / 0`" in failed.stderr
    applied = history(migrated_db)
    assert "schema/9011_notes.sql" in applied and "schema/9010_notes_index.sql" not in applied
    with psycopg.connect(migrated_db) as conn:
        assert conn.execute(
            "select relforcerowsecurity, pg_get_userbyid(relowner) from pg_class"
            " where oid = 'keel.notes'::regclass"
        ).fetchone() == (True, "keel_owner")
        assert conn.execute("select to_regclass('keel.notes_body_idx')").fetchone()[0]
        locks = conn.execute("select count(*) from pg_locks where locktype = 'advisory'")
        assert locks.fetchone() == (0,)
    (sql_tree / "schema" / "9010_notes_index.sql").write_text(
        "-- agentkeel:no-transaction\n"
        "create index concurrently if not exists notes_body_idx on keel.notes (body);\n"
    )
    retried = run_agentkeel("migrate", "up", *args)
    assert retried.returncode == 0, retried.stderr
    assert "applied schema/9010_notes_index.sql" in retried.stdout
    assert run_agentkeel("migrate", "validate", *args).returncode == 0


def test_a_non_empty_keel_schema_it_did_not_create_is_refused(db):
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("create schema keel")
        conn.execute(
            "create function keel.backdoor() returns int language sql security definer"
            " as 'select 1'"
        )
        conn.execute("grant execute on function keel.backdoor() to public")
        for i in range(12):
            conn.execute(f"create table keel.t{i:02} (id int)")
        before = catalog_state(db)
    result = run_agentkeel("migrate", "up", "--dsn", db)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "foreign schema: keel already exists" in result.stderr
    assert "function keel.backdoor()" in result.stderr
    assert "and 3 more" in result.stderr  # 13 objects, 10 named
    assert catalog_state(db) == before
    for command in ("plan", "validate"):
        assert run_agentkeel("migrate", command, "--dsn", db).returncode == 3


def test_an_empty_keel_schema_of_the_migrating_role_is_adopted(db):
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("create schema keel")
    result = run_agentkeel("migrate", "up", "--dsn", db)
    assert result.returncode == 0, result.stderr
    assert run_agentkeel("migrate", "validate", "--dsn", db).returncode == 0


def test_an_empty_keel_schema_of_another_role_is_refused(db, admin_dsn):
    role = f"agentkeel_test_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("create role {} nologin").format(sql.Identifier(role)))
    try:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute(
                sql.SQL("create schema keel authorization {}").format(sql.Identifier(role))
            )
        result = run_agentkeel("migrate", "up", "--dsn", db)
        assert result.returncode == 3, result.stdout + result.stderr
        assert f"an empty keel schema exists but is owned by {role}" in result.stderr
        with psycopg.connect(db) as conn:
            assert conn.execute("select to_regclass('keel.migration_history')").fetchone() == (
                None,
            )
    finally:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("drop schema if exists keel cascade")
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("drop role {}").format(sql.Identifier(role)))
