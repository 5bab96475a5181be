"""Checks made once, before any work: is the DSN a connection string, can we connect, is the
schema there, may the role use it. The CLI and the suite's plugin both call them, so a wrong
password or a role without grants is one line and one exit code, not a test error per test."""

from __future__ import annotations

import re

import psycopg
from psycopg import conninfo

from agentkeel.exitcodes import AgentkeelError, ExitCode

# A trusted role the suite's --dsn may be: it calls the function API for its tenants. What
# that role may not call, the suite calls as a temporary login of the role that may (made
# through --owner-dsn), or skips with the reason.
SUITE_ROLES = ("keel_app", "keel_worker", "keel_owner")
# The catalog checks (--read-only) call keel.tenant_tables() and keel.watchdog_caps(), which
# the trusted roles and keel_auditor may execute.
READ_ONLY_ROLES = (*SUITE_ROLES, "keel_auditor")

SCHEMA_HINT = "run `agentkeel migrate up --dsn ...` first, or pass --migrate"


def check_dsn(dsn: str, option: str = "--dsn") -> None:
    """Refuse what is not a PostgreSQL connection string, saying what is wrong with it."""
    try:
        conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as e:
        raise AgentkeelError(
            f"{option} is not a PostgreSQL connection string ({first_line(e)}): expected "
            "postgresql://user@host:port/dbname or 'host=... dbname=...'",
            ExitCode.USAGE,
        ) from e


# libpq's refusals of an option value, made before it opens any connection
# (`port=abc`, `sslmode=bogus`, `port=99999`): the DSN is wrong, not the network.
BAD_OPTION_VALUE = re.compile(r"\binvalid\b.*\b(value|port number)\b")


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def connect(
    dsn: str, option: str = "--dsn", *, autocommit: bool = True, application_name: str = "agentkeel"
) -> psycopg.Connection:
    """A connection, or AgentkeelError(USAGE / CONNECTION) in one line."""
    check_dsn(dsn, option)
    try:
        return psycopg.connect(
            dsn, autocommit=autocommit, application_name=application_name, connect_timeout=10
        )
    except psycopg.Error as e:
        reason = first_line(e).removeprefix("connection is bad: ")
        if BAD_OPTION_VALUE.search(reason):
            raise AgentkeelError(
                f"{option} has a bad option value: {reason}", ExitCode.USAGE
            ) from e
        raise AgentkeelError(
            f"cannot connect to the {option} database: {first_line(e)}", ExitCode.CONNECTION
        ) from e


def has_schema(conn: psycopg.Connection) -> bool:
    """Is agentkeel installed here? The one test of it (the CLI, `check`, the suite).
    From the catalog: to_regproc() needs USAGE on the schema, which a role without grants
    lacks."""
    row = conn.execute(
        "select exists (select from pg_catalog.pg_proc p"
        " join pg_catalog.pg_namespace n on n.oid = p.pronamespace"
        " where n.nspname = 'keel' and p.proname = 'transition_task')"
    ).fetchone()
    return bool(row and row[0])


def require_schema(conn: psycopg.Connection, option: str = "--dsn") -> None:
    if not has_schema(conn):
        raise AgentkeelError(
            f"the agentkeel schema is not installed in the {option} database: "
            "run `agentkeel migrate up --dsn ...` first",
            ExitCode.SCHEMA_MISSING,
        )


def probe_suite_database(
    dsn: str, option: str = "--dsn", *, migrate: bool = False, read_only: bool = False
) -> None:
    """What the conformance suite needs of --dsn, checked with one connection."""
    with connect(dsn, option, application_name="agentkeel-conformance") as conn:
        if not has_schema(conn):
            if migrate and not read_only:
                return  # the suite applies it
            raise AgentkeelError(
                f"the agentkeel schema is not installed in the {option} database: {SCHEMA_HINT}",
                ExitCode.SCHEMA_MISSING,
            )
        roles = READ_ONLY_ROLES if read_only else SUITE_ROLES
        row = conn.execute(
            "select current_user, exists (select from pg_roles"
            " where rolname = any(%s) and pg_has_role(oid, 'member'))",
            (list(roles),),
        ).fetchone()
        assert row is not None
        user, trusted = row
        if not trusted and read_only:
            raise AgentkeelError(
                f"the {option} role {user!r} is not a member of {', '.join(roles[:-1])} or "
                f"{roles[-1]}: the catalog checks (--read-only) read the schema through "
                "functions only those roles may call (an agent login cannot run them)",
                ExitCode.PERMISSION,
            )
        if read_only:
            return  # the catalog checks read pg_catalog and those functions; nothing is written
        if not trusted:
            raise AgentkeelError(
                f"the {option} role {user!r} is not a member of {', '.join(SUITE_ROLES[:-1])} or "
                f"{SUITE_ROLES[-1]}: the "
                "suite calls the function API as a trusted role (grant keel_app to it, or use "
                "--read-only for the catalog checks only)",
                ExitCode.PERMISSION,
            )
