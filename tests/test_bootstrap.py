"""The DBA's path (`agentkeel bootstrap`): the script it prints creates a least-privilege
migrator, its database and application logins; the migrator installs agentkeel, and the
logins carry their group's role settings."""

from __future__ import annotations

import contextlib
import os
import pty
import re
import select
import subprocess
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import conninfo, sql

from agentkeel.bootstrap import role_settings
from conftest import run_agentkeel

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def unique_names(admin_dsn: str) -> Iterator[dict[str, str]]:
    """Unique names (roles are cluster-wide); everything is dropped afterwards."""
    tag = uuid.uuid4().hex[:8]
    made = {k: f"akb_{k}_{tag}" for k in ("db", "migrator", "app", "worker", "agent", "watchdog")}
    try:
        yield made
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("drop database if exists {} with (force)").format(
                    sql.Identifier(made["db"])
                )
            )
            for key in ("app", "worker", "agent", "watchdog", "migrator"):
                conn.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(made[key])))


@pytest.fixture
def names(admin_dsn: str) -> Iterator[dict[str, str]]:
    with unique_names(admin_dsn) as made:
        yield made


@pytest.fixture
def other_names(admin_dsn: str) -> Iterator[dict[str, str]]:
    with unique_names(admin_dsn) as made:
        yield made


def test_the_printed_script_holds_no_secret_and_copies_the_role_settings():
    printed = run_agentkeel("bootstrap", "--agent-login", "sandbox")
    assert printed.returncode == 0, printed.stderr
    assert "password '" not in printed.stdout
    assert '\\password "sandbox"' in printed.stdout
    assert "cluster-wide" in printed.stdout
    # One agent cannot take every connection of the server.
    assert 'create role "sandbox" login connection limit 20 in role "keel_agent";' in printed.stdout
    agent = [s for s in role_settings() if s.role == "keel_agent"]
    assert {s.name for s in agent} >= {"statement_timeout", "lock_timeout"}
    for s in agent:
        assert f"""alter role "sandbox" set {s.name} = """ in printed.stdout.replace("''", "'")


def test_bootstrap_creates_a_least_privilege_migrator_that_installs_agentkeel(admin_dsn, names):
    applied = run_agentkeel(
        "bootstrap", "--apply", "--dsn", admin_dsn,
        "--database", names["db"], "--migrator", names["migrator"],
        "--app-login", names["app"], "--worker-login", names["worker"],
        "--agent-login", names["agent"], "--watchdog-login", names["watchdog"],
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
        limits = dict(
            conn.execute(
                "select rolname, rolconnlimit from pg_roles where rolname = any(%s)",
                ([names["agent"], names["app"]],),
            ).fetchall()
        )
    assert limits == {names["agent"]: 20, names["app"]: -1}
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
    # The watchdog login sees and may end agent and worker backends: it runs as is.
    watched = run_agentkeel("watchdog", "--dsn", dsn(names["watchdog"]))
    assert watched.returncode == 0, watched.stderr
    assert watched.stdout.strip() == "0 backend(s) ended"


def test_two_installations_on_one_server_let_in_none_of_each_others_logins(
    admin_dsn, names, other_names
):
    """The keel_* roles are shared by every agentkeel database on a server. Bootstrap used
    to grant CONNECT to them, so the first installation's app login created tenants in the
    second and its migrator, a keel_owner member, minted tokens there. Now each login gets
    CONNECT on its own database only."""
    for made in (names, other_names):
        applied = run_agentkeel(
            "bootstrap", "--apply", "--dsn", admin_dsn, "--database", made["db"],
            "--migrator", made["migrator"], "--app-login", made["app"],
        )  # fmt: skip
        assert applied.returncode == 0, applied.stderr
        owner = conninfo.make_conninfo(admin_dsn, user=made["migrator"], dbname=made["db"])
        up = run_agentkeel("migrate", "up", "--dsn", owner)
        assert up.returncode == 0, up.stderr
    for key in ("app", "migrator"):
        foreign = conninfo.make_conninfo(admin_dsn, user=names[key], dbname=other_names["db"])
        with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
            psycopg.connect(foreign).close()
    own = conninfo.make_conninfo(admin_dsn, user=other_names["app"], dbname=other_names["db"])
    with psycopg.connect(own) as conn:
        assert conn.execute("select current_user").fetchone() == (other_names["app"],)
    checked = run_agentkeel(
        "check", "--dsn", conninfo.make_conninfo(admin_dsn, dbname=other_names["db"])
    )
    assert checked.returncode == 0, checked.stdout
    assert "database_connect" in checked.stdout and "warning" not in checked.stdout


def psql_at_a_terminal(args: list[str], passwords: dict[str, str], timeout: float = 60) -> str:
    """Run psql with a terminal of its own, as a DBA does, answering its \\password prompts
    ('Enter new password for user "NAME":', then 'Enter it again:'). Returns what it wrote."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: psql on the new terminal
        os.execvp(args[0], args)
    seen = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if not ready:
                continue
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: psql exited and the terminal closed
                break
            if not chunk:
                break
            seen += chunk
            tail = seen[-200:].decode(errors="replace")
            asked = re.search(r'Enter new password for user "([^"]+)": *$', tail)
            if asked:
                os.write(fd, passwords[asked.group(1)].encode() + b"\n")
            elif re.search(r"Enter it again: *$", tail):
                os.write(fd, passwords[last_asked(seen)].encode() + b"\n")
        else:
            pytest.fail(f"psql did not finish in {timeout}s:\n{seen.decode(errors='replace')}")
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    text = seen.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0, text
    return text


def last_asked(seen: bytes) -> str:
    return re.findall(rb'Enter new password for user "([^"]+)"', seen)[-1].decode()


def test_the_printed_script_stops_before_anything_when_psql_has_no_terminal(
    admin_dsn, names, tmp_path
):
    """psql's \\password reads from /dev/tty, else from standard input: in a job or a
    pipeline it read an empty line, cleared the password and exited 0. The script now
    stops first, exit 3 even without -v ON_ERROR_STOP=1, and has created nothing."""
    printed = run_agentkeel(
        "bootstrap", "--database", names["db"], "--migrator", names["migrator"],
        "--app-login", names["app"],
    )  # fmt: skip
    assert printed.returncode == 0, printed.stderr
    script = tmp_path / "bootstrap.sql"
    script.write_text(printed.stdout)
    for stdin in (subprocess.DEVNULL, None):  # no input at all; or the script itself
        ran = subprocess.run(
            ["psql", "-X", "-d", admin_dsn, *(["-f", str(script)] if stdin else [])],
            input=None if stdin else printed.stdout,
            stdin=stdin,
            capture_output=True,
            text=True,
            start_new_session=True,  # no controlling terminal: /dev/tty cannot be opened
            timeout=60,
        )
        assert ran.returncode == 3, ran.stdout + ran.stderr
        assert "psql has no terminal for its \\password prompts" in ran.stderr
        assert "--password-from-env" in ran.stderr
        with psycopg.connect(admin_dsn) as conn:
            made = conn.execute(
                "select rolname from pg_roles where rolname = any(%s)",
                ([names["migrator"], names["app"]],),
            ).fetchall()
        assert made == []


def test_the_printed_script_runs_in_psql_and_the_suite_passes_as_its_application_logins(
    admin_dsn, names, tmp_path
):
    """The whole DBA path as written: the printed script through `psql -f` (answering its
    \\password prompts), `migrate up` as the migrator, then the conformance suite with an
    application login as --dsn and the migrator as --owner-dsn. What the login's role may
    not call (claim_next_task for keel_app, create_tenant for keel_worker) the suite calls
    as a temporary login of the role that may; the migration history is read through
    keel.applied_migrations(). Nothing fails, and nothing but the throwaway-cluster tests
    is skipped."""
    printed = run_agentkeel(
        "bootstrap", "--database", names["db"], "--migrator", names["migrator"],
        "--app-login", names["app"], "--worker-login", names["worker"],
        "--agent-login", names["agent"],
    )  # fmt: skip
    assert printed.returncode == 0, printed.stderr
    script = tmp_path / "bootstrap.sql"
    script.write_text(printed.stdout)
    passwords = {names[k]: f"pw-{k}-{uuid.uuid4().hex[:6]}" for k in names if k != "db"}
    psql_at_a_terminal(
        ["psql", "-X", "-v", "ON_ERROR_STOP=1", "-d", admin_dsn, "-f", str(script)], passwords
    )

    def dsn(key: str) -> str:
        return conninfo.make_conninfo(
            admin_dsn, user=names[key], password=passwords[names[key]], dbname=names["db"]
        )

    up = run_agentkeel("migrate", "up", "--dsn", dsn("migrator"))
    assert up.returncode == 0, up.stderr
    for login, selection in (("app", []), ("worker", ["-k", "g5 or g12 or interleaving"])):
        suite = run_agentkeel(
            "conformance", "--dsn", dsn(login), "--owner-dsn", dsn("migrator"), "-q", *selection
        )
        assert suite.returncode == 0, f"as {login}:\n{suite.stdout[-4000:]}"
        assert re.search(r"│ G5\s+│.*│ passed\s+│", suite.stdout), suite.stdout[-3000:]
        assert re.search(r"│ G12\s+│.*│ passed\s+│", suite.stdout), suite.stdout[-3000:]
        skips = [line for line in suite.stdout.splitlines() if " SKIPPED " in line]
        allowed = ("embedded cluster only", "exists from PostgreSQL 17 on", "is not installed")
        assert all(any(reason in line for reason in allowed) for line in skips), skips
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        left = conn.execute("select rolname from pg_roles where rolname like 'akc\\_%'").fetchall()
    assert not left, f"the suite left its temporary logins: {left}"
