"""The CLI's one error path: a documented exit code for every error class, one line of
message, the traceback only under --debug; commands that need a database refuse without one."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
import uuid

import click
import psycopg
import pytest
from click.testing import CliRunner
from psycopg import conninfo, sql

import agentkeel.cli.lint
from agentkeel.cli import main
from agentkeel.exitcodes import ExitCode
from agentkeel.suite_options import SUITE_OPTIONS, plugin_args
from conftest import AGENTKEEL, REPO, run_agentkeel

UNREACHABLE = "postgresql://nobody@127.0.0.1:1/none"
PLAIN_PYTEST = [
    sys.executable,
    "-m",
    "pytest",
    "-p",
    "agentkeel_conformance.plugin",
    "--pyargs",
    "agentkeel_conformance",
]


def test_every_member_is_documented_and_distinct():
    assert len({int(m) for m in ExitCode}) == len(ExitCode)
    assert all(m.description for m in ExitCode)
    # The suite's plugin exits with these itself: none may be one of pytest's own 2-5.
    plugin_codes = {
        ExitCode.CONNECTION,
        ExitCode.PERMISSION,
        ExitCode.SCHEMA_MISSING,
    }
    assert not plugin_codes & {2, 3, 4, 5}


def test_an_unexpected_error_is_one_line_and_the_internal_code(monkeypatch):
    def broken(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(agentkeel.cli.lint, "run_lint", broken)
    result = CliRunner().invoke(main, ["lint", "--static-only"])
    assert result.exit_code == ExitCode.INTERNAL, result.output
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "internal error: ZeroDivisionError: a bug" in lines[0], lines
    debug = CliRunner().invoke(main, ["--debug", "lint", "--static-only"])
    assert debug.exit_code == ExitCode.INTERNAL
    assert "Traceback" in debug.output and "ZeroDivisionError" in debug.output


@pytest.mark.parametrize(
    "command",
    [
        ("migrate", "up"),
        ("migrate", "status"),
        ("migrate", "plan"),
        ("migrate", "validate"),
        ("check",),
        ("distribute",),
    ],
)
def test_commands_on_a_users_database_refuse_without_a_dsn(command):
    result = run_agentkeel(*command)
    assert result.returncode == ExitCode.USAGE, result.stdout + result.stderr
    assert "applied" not in result.stdout
    assert "--dsn" in result.stderr and "AGENTKEEL_DSN" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_bootstrap_apply_without_a_dsn_names_the_variable_it_reads():
    result = run_agentkeel("bootstrap", "--apply", "--app-login", "akt_nobody")
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert result.stderr.strip() == (
        "agentkeel: error: `agentkeel bootstrap` needs a database: "
        "pass --dsn or set AGENTKEEL_BOOTSTRAP_DSN"
    )


@pytest.mark.parametrize("command", [("migrate", "status"), ("check",), ("conformance",)])
def test_a_dsn_that_is_not_a_connection_string_says_so(command):
    result = run_agentkeel(*command, "--dsn", "not a dsn")
    assert result.returncode == ExitCode.USAGE, result.stdout + result.stderr
    assert "--dsn is not a PostgreSQL connection string" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "dsn",
    [
        "host=127.0.0.1 port=abc dbname=x",
        "postgresql://postgres@127.0.0.1/x?sslmode=bogus",
        "host=127.0.0.1 port=99999 dbname=x",
    ],
)
@pytest.mark.parametrize(
    "command",
    [
        ("migrate", "status"),
        ("check",),
        ("relay", "--sink", "-", "--once"),
        ("relay", "status"),
        ("recover", "--once"),
        ("watchdog", "--once"),
    ],
    ids=lambda c: " ".join(c),
)
def test_a_dsn_with_a_bad_option_value_is_a_usage_error(command, dsn):
    """libpq refuses these before it opens a connection: exit 2, not the network's 6."""
    result = run_agentkeel(*command, "--dsn", dsn)
    assert result.returncode == ExitCode.USAGE, result.stdout + result.stderr
    assert "--dsn has a bad option value" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_distribute_refuses_a_database_without_the_schema(db):
    result = run_agentkeel("distribute", "--dsn", db)
    assert result.returncode == ExitCode.SCHEMA_MISSING, result.stdout + result.stderr
    assert "agentkeel migrate up" in result.stderr
    assert result.stdout == ""


def test_tables_are_printed_whole_when_stdout_is_not_a_terminal(migrated_db):
    """A CI log or a pipe: no cell cut at 80 columns (rich's default without a terminal),
    also where the runner sets COLUMNS=80 (pytest-xdist's workers do)."""
    env = {**os.environ, "COLUMNS": "80"}

    def printed(*args: str) -> str:
        result = subprocess.run(
            [*AGENTKEEL, *args], capture_output=True, text=True, env=env, timeout=120
        )
        assert result.returncode == 0, result.stderr
        assert "…" not in result.stdout, result.stdout
        return result.stdout

    status = printed("migrate", "status", "--dsn", migrated_db)
    names = [p.relative_to(REPO).as_posix() for p in sorted((REPO / "schema").glob("*.sql"))]
    assert all(name in status for name in names), status
    exit_codes = printed("exit-codes")
    assert all(member.description in exit_codes for member in ExitCode), exit_codes


def commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found += commands(command, (*path, name))
        if command.callback is not None:
            found.append((*path, name))
    return found


def test_machine_output_has_one_spelling_everywhere():
    """`--format json` on every command that prints JSON; `--json` only as a hidden alias."""
    with_json = []
    for path in commands(main):
        command = main
        for name in path:
            command = command.commands[name]  # type: ignore[attr-defined]
        options = {o: p for p in command.params for o in getattr(p, "opts", [])}
        visible = [o for o, p in options.items() if not getattr(p, "hidden", False)]
        assert "--json" not in visible, path
        if "--format" in options:
            assert "json" in options["--format"].type.choices, path
            with_json.append(path)
    assert {("migrate", "status"), ("check",), ("lint",), ("bench",), ("relay", "status")} <= set(
        with_json
    )


def test_the_old_json_flag_still_works_and_says_so(migrated_db):
    result = run_agentkeel("migrate", "status", "--dsn", migrated_db, "--json")
    assert result.returncode == ExitCode.OK, result.stderr
    assert json.loads(result.stdout)["up_to_date"] is True
    assert result.stderr.strip() == "agentkeel: --json is deprecated: use --format json"


def test_migrate_status_exits_refused_on_drift_and_has_json(migrated_db):
    clean = run_agentkeel("migrate", "status", "--dsn", migrated_db, "--format", "json")
    assert clean.returncode == ExitCode.OK, clean.stderr
    report = json.loads(clean.stdout)
    assert report["up_to_date"] is True and report["problems"] == []
    states = {m["name"]: m["state"] for m in report["migrations"]}
    assert states["schema/0006_tasks.sql"] == "applied"
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        conn.execute(
            "update keel.migration_history set checksum = repeat('0', 64)"
            " where name = 'schema/0006_tasks.sql'"
        )
    drifted = run_agentkeel("migrate", "status", "--dsn", migrated_db, "--format", "json")
    assert drifted.returncode == ExitCode.REFUSED
    report = json.loads(drifted.stdout)
    assert report["up_to_date"] is False
    assert {m["name"]: m["state"] for m in report["migrations"]}["schema/0006_tasks.sql"] == "drift"
    assert any("schema/0006_tasks.sql" in p for p in report["problems"])
    human = run_agentkeel("migrate", "status", "--dsn", migrated_db)
    assert human.returncode == ExitCode.REFUSED
    assert "drift: schema/0006_tasks.sql" in human.stderr


def test_bench_ignores_agentkeel_dsn_and_uses_an_embedded_cluster():
    result = run_agentkeel(
        "bench",
        "--workload",
        "policy",
        "--rows",
        "50",
        "--repeats",
        "1",
        env={"AGENTKEEL_DSN": UNREACHABLE},
    )
    assert result.returncode == ExitCode.OK, result.stderr
    assert "agent, signed token, keel.list_tasks page" in result.stdout


# -- the conformance suite fails fast ------------------------------------------------


def _one_line_before_any_test(result) -> None:
    output = result.stdout + result.stderr
    assert len(output.strip().splitlines()) == 1, output[-3000:]
    assert "passed" not in output and "error" in output


def test_an_unreachable_host_fails_fast_with_the_connection_code():
    result = run_agentkeel("conformance", "--dsn", UNREACHABLE, "-q")
    assert result.returncode == ExitCode.CONNECTION
    assert "cannot connect to the --dsn database" in result.stderr
    _one_line_before_any_test(result)


def test_an_unknown_login_fails_fast_with_the_connection_code(migrated_db):
    # The test clusters use trust authentication, so a wrong password cannot be shown here;
    # it fails in psycopg.connect exactly like an unknown login does.
    wrong = conninfo.make_conninfo(migrated_db, user="ak_no_such_role", password="wrong")
    result = run_agentkeel("conformance", "--dsn", wrong, "-q")
    assert result.returncode == ExitCode.CONNECTION
    assert "ak_no_such_role" in result.stderr
    _one_line_before_any_test(result)


def test_a_role_without_grants_fails_fast_with_the_permission_code(migrated_db):
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        conn.execute("create role ak_no_grants login")
    try:
        dsn = conninfo.make_conninfo(migrated_db, user="ak_no_grants")
        result = run_agentkeel("conformance", "--dsn", dsn, "-q")
        assert result.returncode == ExitCode.PERMISSION, result.stdout[-2000:]
        assert "'ak_no_grants' is not a member of keel_app" in result.stderr
        _one_line_before_any_test(result)
    finally:
        with psycopg.connect(migrated_db, autocommit=True) as conn:
            conn.execute("drop role ak_no_grants")


def test_check_by_a_role_without_rights_is_the_permission_code(migrated_db):
    """Not five rule errors telling a DBA to run `migrate up` on an up-to-date database."""
    name = f"akt_norights_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        conn.execute(sql.SQL("create role {} login").format(sql.Identifier(name)))
    try:
        dsn = conninfo.make_conninfo(migrated_db, user=name)
        result = run_agentkeel("check", "--dsn", dsn)
        assert result.returncode == ExitCode.PERMISSION, result.stdout[-2000:]
        assert result.stdout == ""
        assert result.stderr.strip() == (
            f"agentkeel: error: role {name} may not read the keel schema, so no rule can run: "
            "run `agentkeel check` as the migrator or a member of a keel_* role "
            "(keel_auditor is enough)"
        )
    finally:
        with psycopg.connect(migrated_db, autocommit=True) as conn:
            conn.execute(sql.SQL("drop role {}").format(sql.Identifier(name)))


def test_plain_pytest_with_the_plugin_fails_fast_too():
    def plain(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*PLAIN_PYTEST, "-q", *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )

    unreachable = plain("--keel-dsn", UNREACHABLE)
    assert unreachable.returncode == ExitCode.CONNECTION
    _one_line_before_any_test(unreachable)
    malformed = plain("--keel-dsn", "not a dsn")
    assert malformed.returncode == pytest.ExitCode.USAGE_ERROR
    assert "--keel-dsn is not a PostgreSQL connection string" in malformed.stderr
    _one_line_before_any_test(malformed)


# -- help ---------------------------------------------------------------------


def test_top_level_help_is_not_cut_mid_phrase():
    result = run_agentkeel("--help", env={"COLUMNS": "80"})
    assert result.returncode == 0
    commands = result.stdout.split("Commands:\n", 1)[1]
    assert "..." not in commands
    for name, command in main.commands.items():
        assert re.search(
            rf"^  {re.escape(name)}\s+{re.escape(command.get_short_help_str(200))}$",
            commands,
            flags=re.MULTILINE,
        ), name


def test_conformance_help_lists_the_suites_own_options():
    result = run_agentkeel("conformance", "--help")
    assert result.returncode == 0
    for flag in ("--owner-dsn", "--migrate", "--read-only", "--testcontainers", "--artifacts"):
        assert flag in result.stdout
    assert {o.flag for o in SUITE_OPTIONS} >= {"--keel-dsn", "--keel-owner-dsn", "--keel-migrate"}


def test_the_plugins_options_cannot_clash_and_the_cli_maps_its_spellings():
    """pytest sees --keel-*; `agentkeel conformance` takes --dsn, --owner-dsn ... as well."""
    assert all(o.flag.startswith("--keel-") for o in SUITE_OPTIONS)
    assert plugin_args(["--owner-dsn", "x", "--artifacts=d", "-k", "g3", "--read-only"]) == [
        "--keel-owner-dsn",
        "x",
        "--keel-artifacts=d",
        "-k",
        "g3",
        "--keel-read-only",
    ]


def test_pytest_xdist_is_installed_with_agentkeel_itself():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert any(d.startswith("pytest-xdist") for d in project["dependencies"])
