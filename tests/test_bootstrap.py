"""The DBA's path (`agentkeel bootstrap`): the script it prints creates a least-privilege
migrator, its database and application logins; the migrator installs agentkeel, and the
logins carry their group's role settings."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import conninfo, sql

from agentkeel.bootstrap import role_settings
from conftest import run_agentkeel

pytestmark = pytest.mark.slow


@pytest.fixture
def names(admin_dsn: str) -> Iterator[dict[str, str]]:
    """Unique names (roles are cluster-wide); everything is dropped afterwards."""
    tag = uuid.uuid4().hex[:8]
    made = {k: f"akb_{k}_{tag}" for k in ("db", "migrator", "app", "worker", "agent")}
    yield made
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(made["db"]))
        )
        for key in ("app", "worker", "agent", "migrator"):
            conn.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(made[key])))


def test_the_printed_script_holds_no_secret_and_copies_the_role_settings():
    printed = run_agentkeel("bootstrap", "--agent-login", "sandbox")
    assert printed.returncode == 0, printed.stderr
    assert "password '" not in printed.stdout
    assert '\\password "sandbox"' in printed.stdout
    assert "cluster-wide" in printed.stdout
    agent = [s for s in role_settings() if s.role == "keel_agent"]
    assert {s.name for s in agent} >= {"statement_timeout", "lock_timeout"}
    for s in agent:
        assert f"""alter role "sandbox" set {s.name} = """ in printed.stdout.replace("''", "'")


def test_bootstrap_creates_a_least_privilege_migrator_that_installs_agentkeel(admin_dsn, names):
    applied = run_agentkeel(
        "bootstrap", "--apply", "--dsn", admin_dsn,
        "--database", names["db"], "--migrator", names["migrator"],
        "--app-login", names["app"], "--worker-login", names["worker"],
        "--agent-login", names["agent"],
    )  # fmt: skip
    assert applied.returncode == 0, applied.stderr

    def dsn(user: str) -> str:
        return conninfo.make_conninfo(admin_dsn, user=user, dbname=names["db"])

    migrator = dsn(names["migrator"])
    with psycopg.connect(migrator) as conn:
        assert conn.execute(
            "select rolsuper, rolcreatedb, rolbypassrls, rolcreaterole from pg_roles"
            " where rolname = current_user"
        ).fetchone() == (False, False, False, True)
    up = run_agentkeel("migrate", "up", "--dsn", migrator)
    assert up.returncode == 0, up.stderr
    with psycopg.connect(migrator) as conn:
        settings = dict(
            conn.execute(
                "select unnest(setconfig) as s, 1 from pg_db_role_setting"
                " where setrole = %s::regrole",
                (names["worker"],),
            ).fetchall()
        )
    assert "statement_timeout=30s" in settings
