"""The migrator through PgBouncer in transaction mode (G12): production apps connect through
a pooler, and a DBA may point the migrator at the same DSN."""

from __future__ import annotations

import subprocess

import psycopg
from psycopg import conninfo

from agentkeel.migrate import load_sources
from agentkeel.pooler import is_pooled
from conftest import AGENTKEEL, run_agentkeel


def advisory_locks(dsn: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "select pid, classid, objid, mode from pg_locks where locktype = 'advisory'"
        ).fetchall()


def test_the_fixture_pools_and_the_migrator_sees_it(db, through_pgbouncer):
    pooled = through_pgbouncer(db)
    with psycopg.connect(pooled, autocommit=True, prepare_threshold=None) as conn:
        assert is_pooled(conn)
        assert conn.execute("select current_database()").fetchone() == (
            conninfo.conninfo_to_dict(db)["dbname"],
        )
    with psycopg.connect(db, autocommit=True) as conn:
        assert not is_pooled(conn)


def test_two_migrators_through_pgbouncer_serialize_and_leave_no_lock(
    migrated_db, sql_tree, through_pgbouncer
):
    """An upgrade through the pooler: two new transactional files, two migrators at once.
    (A fresh install holds no-transaction files, concurrent index builds, which a pooler
    cannot run: the first `migrate up` goes direct; test_no_transaction_files_... below.)"""
    (sql_tree / "schema" / "9001_first.sql").write_text("create table keel.first (id int);\n")
    (sql_tree / "schema" / "9002_second.sql").write_text("create table keel.second (id int);\n")
    pooled = through_pgbouncer(migrated_db)
    procs = [
        subprocess.Popen(
            [*AGENTKEEL, "migrate", "up", "--dsn", pooled, "--sql-dir", str(sql_tree)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    stdouts = [out for out, _ in outputs]
    assert sum("nothing to do" in out for out in stdouts) == 1, outputs
    assert sum("applied schema/9001_first.sql" in out for out in stdouts) == 1, outputs
    with psycopg.connect(migrated_db) as conn:
        assert conn.execute("select count(*) from keel.migration_history").fetchone() == (
            len(load_sources(sql_tree)),
        )
    # The pooler keeps its server connections: a session lock would still be held on one.
    assert advisory_locks(migrated_db) == []
    again = run_agentkeel("migrate", "up", "--dsn", pooled, "--sql-dir", str(sql_tree))
    assert again.stdout.strip().endswith("up to date")


def test_no_transaction_files_are_refused_through_a_pooler(
    migrated_db, sql_tree, through_pgbouncer
):
    (sql_tree / "schema" / "9010_concurrent_index.sql").write_text(
        "-- agentkeel:no-transaction\n"
        "create index concurrently if not exists tenants_name_idx on keel.tenants (name);\n"
    )
    (sql_tree / "schema" / "9011_more.sql").write_text("create table keel.more (id int);\n")
    pooled = through_pgbouncer(migrated_db)
    # status and plan say so with the same code (docs/errors.md), before up is tried.
    for command in ("status", "plan"):
        said = run_agentkeel("migrate", command, "--dsn", pooled, "--sql-dir", str(sql_tree))
        assert said.returncode == 3, said.stdout + said.stderr
        assert "pooled connection: schema/9010_concurrent_index.sql" in said.stderr
    result = run_agentkeel("migrate", "up", "--dsn", pooled, "--sql-dir", str(sql_tree))
    assert result.returncode == 3, result.stdout + result.stderr
    assert "pooled connection: schema/9010_concurrent_index.sql" in result.stderr
    assert "connect directly" in result.stderr
    with psycopg.connect(migrated_db) as conn:
        assert conn.execute("select to_regclass('keel.more')").fetchone() == (None,)
    assert advisory_locks(migrated_db) == []
    direct = run_agentkeel("migrate", "up", "--dsn", migrated_db, "--sql-dir", str(sql_tree))
    assert direct.returncode == 0, direct.stderr
