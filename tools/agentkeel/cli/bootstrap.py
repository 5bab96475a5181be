"""`agentkeel bootstrap`: the DBA's script (migrator, database, logins)."""

from __future__ import annotations

import os

import click

from agentkeel.bootstrap import AGENT_CONNECTION_LIMIT, Login
from agentkeel.bootstrap import Plan as BootstrapPlan
from agentkeel.bootstrap import apply as apply_bootstrap
from agentkeel.cli.app import (
    dsn_option,
    fail,
    main,
    out,
    require_dsn,
)
from agentkeel.exitcodes import ExitCode
from agentkeel.preflight import connect as connect_dsn


@main.command(short_help="Print (or run) the DBA's script: migrator, database, logins.")
@dsn_option(
    envvar="AGENTKEEL_BOOTSTRAP_DSN",
    help="With --apply: a superuser or CREATEROLE connection ($AGENTKEEL_BOOTSTRAP_DSN).",
)
@click.option("--apply", "apply_", is_flag=True, help="Run the script; default: print it.")
@click.option("--database", default="agentkeel", show_default=True, help="Database to create.")
@click.option(
    "--citus",
    is_flag=True,
    help="For a Citus cluster: the database exists (citus on every node, workers added); the"
    " script runs in it, so that every role reaches every node, and hands it to the migrator.",
)
@click.option(
    "--migrator", default="agentkeel_migrator", show_default=True, help="Migrator login to create."
)
@click.option("--app-login", "app_logins", multiple=True, metavar="NAME", help="keel_app login.")
@click.option(
    "--worker-login", "worker_logins", multiple=True, metavar="NAME", help="keel_worker login."
)
@click.option(
    "--agent-login", "agent_logins", multiple=True, metavar="NAME", help="keel_agent login."
)
@click.option(
    "--agent-connection-limit",
    type=click.IntRange(1, 10_000),
    default=AGENT_CONNECTION_LIMIT,
    show_default=True,
    metavar="N",
    help="CONNECTION LIMIT of each --agent-login.",
)
@click.option(
    "--watchdog-login",
    "watchdog_logins",
    multiple=True,
    metavar="NAME",
    help="keel_watchdog login (also pg_read_all_stats, pg_signal_backend).",
)
@click.option(
    "--password-from-env",
    "password_envs",
    multiple=True,
    metavar="LOGIN=VAR",
    help="With --apply: set LOGIN's password from $VAR (sent as a SCRAM verifier). Printed "
    "scripts use psql's \\password instead.",
)
def bootstrap(
    dsn: str | None,
    apply_: bool,
    database: str,
    citus: bool,
    migrator: str,
    app_logins: tuple[str, ...],
    worker_logins: tuple[str, ...],
    agent_logins: tuple[str, ...],
    agent_connection_limit: int,
    watchdog_logins: tuple[str, ...],
    password_envs: tuple[str, ...],
) -> None:
    """Print the psql script that creates the migrator login (LOGIN CREATEROLE), the
    database it owns, application logins in keel_app / keel_worker / keel_agent with
    their group's role settings, and watchdog logins; --apply --dsn runs it. Roles are
    cluster-wide."""
    logins = [
        Login(name, group, agent_connection_limit if group == "keel_agent" else None)
        for group, names in (
            ("keel_app", app_logins),
            ("keel_worker", worker_logins),
            ("keel_agent", agent_logins),
            ("keel_watchdog", watchdog_logins),
        )
        for name in names
    ]
    plan = BootstrapPlan(database, migrator, logins, citus)
    if not apply_:
        if password_envs:
            fail(
                "--password-from-env needs --apply: a printed script holds no secret",
                ExitCode.USAGE,
            )
        click.echo(plan.script(), nl=False)
        return
    passwords: dict[str, str] = {}
    known = {migrator, *(login.name for login in logins)}
    for item in password_envs:
        login, sep, var = item.partition("=")
        if not sep or login not in known:
            fail(
                f"--password-from-env {item!r}: expected LOGIN=VAR for a login this command "
                f"creates ({', '.join(sorted(known))})",
                ExitCode.USAGE,
            )
        if not os.environ.get(var):
            fail(f"--password-from-env {item!r}: ${var} is not set or empty", ExitCode.USAGE)
        passwords[login] = os.environ[var]
    with connect_dsn(require_dsn(dsn)) as conn:
        for stmt in apply_bootstrap(conn, plan, passwords):
            out.print(stmt, markup=False)
    unset = sorted(known - passwords.keys())
    if unset:
        out.print(
            f"no password set for {', '.join(unset)}: psql's \\password sets one", markup=False
        )
    out.print("bootstrapped")
