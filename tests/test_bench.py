"""`agentkeel bench` measures every case and leaves nothing behind."""

from __future__ import annotations

import psycopg

from agentkeel.bench import run
from conftest import run_agentkeel


def test_every_case_is_measured_and_cleaned_up(migrated_db):
    results = run(migrated_db, rows=200, repeats=1)
    assert [m.case.split(",")[0] for m in results] == [
        "no RLS (owner",
        "app",
        "app",
        "agent",
    ]
    assert all(m.best_ms > 0 for m in results)
    assert [m.rows_scanned for m in results] == [400, 400, 400, 200]
    with psycopg.connect(migrated_db) as conn:
        assert conn.execute("select count(*) from keel.tenants").fetchone() == (0,)
        assert conn.execute("select count(*) from keel.workflows").fetchone() == (0,)
        assert conn.execute(
            "select count(*) from pg_roles where rolname like 'bench%'"
        ).fetchone() == (0,)


def test_the_command_prints_the_table(migrated_db):
    result = run_agentkeel("bench", "--dsn", migrated_db, "--rows", "100", "--repeats", "1")
    assert result.returncode == 0, result.stderr
    assert "agent, signed token, keel.list_tasks page" in result.stdout
