"""Nothing needs a superuser: a database owner with CREATEROLE (what managed services give)
installs agentkeel, passes `agentkeel check` and the conformance suite."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import conninfo

from agentkeel.embedded import EmbeddedPostgres
from conftest import run_agentkeel

pytestmark = pytest.mark.slow


def test_a_createrole_database_owner_installs_checks_and_passes_the_suite():
    # A cluster of its own: the keel roles must not exist yet, as on a new managed instance.
    with EmbeddedPostgres() as pg:
        with psycopg.connect(pg.dsn, autocommit=True) as su:
            su.execute("create role ak_owner login password 'pw' createrole")
            su.execute("create database ak_app owner ak_owner")
        dsn = conninfo.make_conninfo(pg.dsn, user="ak_owner", password="pw", dbname="ak_app")
        with psycopg.connect(dsn) as conn:
            assert conn.execute(
                "select rolsuper from pg_roles where rolname = current_user"
            ).fetchone() == (False,)

        up = run_agentkeel("migrate", "up", "--dsn", dsn)
        assert up.returncode == 0, up.stderr
        # The count is the "applied" lines: policies/ run again after the no-transaction
        # files, and say so, rather than being counted once and listed twice.
        lines = up.stdout.splitlines()
        applied = [line for line in lines if line.startswith("applied ")]
        again = [line for line in lines if line.startswith("re-applied policies/")]
        assert len({line.split()[1] for line in applied}) == len(applied)
        assert again, up.stdout
        assert lines[-1].startswith(f"{len(applied)} files applied, {len(again)} of them twice")
        assert run_agentkeel("migrate", "up", "--dsn", dsn).stdout.strip().endswith("up to date")
        check = run_agentkeel("check", "--dsn", dsn)
        assert check.returncode == 0, check.stdout
        suite = run_agentkeel("conformance", "--dsn", dsn, "-q", "-x")
        assert suite.returncode == 0, suite.stdout[-4000:]
        skips = [line for line in suite.stdout.splitlines() if " SKIPPED " in line]
        # Only the throwaway-cluster tests, and what this server version lacks, may skip.
        allowed = ("embedded cluster only", "exists from PostgreSQL 17 on", "is not installed")
        assert all(any(reason in line for reason in allowed) for line in skips), skips
