"""The DBA's first step (`agentkeel bootstrap`): a psql script that creates the migrator
login, the database it owns and, optionally, application logins in keel_app, keel_worker
and keel_agent with the role settings policies/06_role_settings.sql gives those groups,
and watchdog logins (keel_watchdog, with pg_read_all_stats and pg_signal_backend).

Least privilege for the migrator: LOGIN CREATEROLE, nothing else (no SUPERUSER, CREATEDB,
REPLICATION or BYPASSRLS). CREATEROLE cannot be avoided by pre-creating the group roles:
every `migrate up` re-runs policies/, which `alter role keel_* set ...`, `comment on role`
and `grant keel_owner to ...`, and PostgreSQL lets only a superuser or a CREATEROLE role
(16+: CREATEROLE with ADMIN OPTION on the target) do that. So the script creates the
NOLOGIN group roles the logins join (the same ones policies/01_roles.sql creates if missing)
and, on PostgreSQL 16+, gives the migrator ADMIN OPTION on them without membership
(INHERIT FALSE, SET FALSE), which a role created by someone else would otherwise lack.

No secret ever enters the script: it sets passwords with psql's `\\password` (prompted);
`--apply` takes them from environment variables and sends them hashed (SCRAM, computed by
libpq on this side), so not even the server log sees the clear text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pglast
import psycopg
from pglast import ast
from psycopg import sql

from agentkeel.sql_files import sql_root

# The group roles an application login may join, and what each is for.
LOGIN_GROUPS = {
    "keel_app": "trusted server code: the function API for the tenant in its context",
    "keel_worker": "claims work across tenants, then acts within the claimed tenant",
    "keel_agent": "untrusted generated SQL: approved functions only, its signed tenant only",
    "keel_watchdog": "ends agent and worker backends past the caps (`agentkeel watchdog`)",
}
# The default CONNECTION LIMIT of an agent login (bootstrap --agent-connection-limit).
AGENT_CONNECTION_LIMIT = 20
# What a watchdog login needs beyond its group: to see other logins' backend times and to
# end their backends. Granted to the login, never to the keel_watchdog group, which every
# agentkeel database on the server shares.
WATCHDOG_PREDEFINED = ("pg_read_all_stats", "pg_signal_backend")


@dataclass(frozen=True)
class RoleSetting:
    role: str
    name: str
    value: str
    min_version_num: int | None = None  # set only on servers at least this new


def keel_group_roles(root: Path | None = None) -> list[str]:
    """The group roles policies/01_roles.sql creates, in its order."""
    text = ((root or sql_root()) / "policies" / "01_roles.sql").read_text()
    return list(dict.fromkeys(re.findall(r"'(keel_[a-z_]+)'", text)))


def _value(node: ast.Node) -> str:
    if isinstance(node, ast.A_Const) and node.val is not None:
        val = node.val
        if isinstance(val, ast.String):
            return str(val.sval)
        if isinstance(val, ast.Integer):
            return str(val.ival)
        if isinstance(val, ast.Float):
            return str(val.fval)
    raise ValueError(f"unsupported role setting value: {node}")


def _settings_of(stmt: ast.Node | None, min_version: int | None) -> list[RoleSetting]:
    if not isinstance(stmt, ast.AlterRoleSetStmt) or stmt.role is None:
        return []
    set_stmt = stmt.setstmt
    if set_stmt is None or set_stmt.kind != pglast.enums.VariableSetKind.VAR_SET_VALUE:
        return []
    value = ", ".join(_value(arg) for arg in set_stmt.args or ())
    return [RoleSetting(str(stmt.role.rolename), str(set_stmt.name), value, min_version)]


def role_settings(root: Path | None = None) -> list[RoleSetting]:
    """Every `alter role ... set` of policies/06_role_settings.sql, parsed (pglast), including
    those a DO block runs only from some server version on (`execute '<alter role ...>'`)."""
    text = ((root or sql_root()) / "policies" / "06_role_settings.sql").read_text()
    found: list[RoleSetting] = []
    for raw in pglast.parse_sql(text):
        stmt = raw.stmt
        if isinstance(stmt, ast.DoStmt):
            body = next(str(d.arg.sval) for d in stmt.args or () if d.defname == "as")
            guard = re.search(r"server_version_num'\)::integer\s*>=\s*(\d+)", body)
            for literal in re.findall(r"execute\s+'((?:[^']|'')*)'", body):
                for inner in pglast.parse_sql(literal.replace("''", "'")):
                    found += _settings_of(inner.stmt, int(guard.group(1)) if guard else None)
        else:
            found += _settings_of(stmt, None)
    return found


@dataclass(frozen=True)
class Login:
    name: str
    group: str
    # CONNECTION LIMIT: an agent login gets one (bootstrap --agent-connection-limit), so
    # one agent cannot take every connection the server has.
    connection_limit: int | None = None


def _ident(name: str) -> str:
    return sql.Identifier(name).as_string(None)


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _version_guarded(min_version: int, statement: str) -> str:
    return (
        "do $$\nbegin\n"
        f"    if pg_catalog.current_setting('server_version_num')::integer >= {min_version} then\n"
        f"        execute {_literal(statement.rstrip(';'))};\n"
        "    end if;\nend;\n$$;"
    )


def login_statements(login: Login, settings: list[RoleSetting], database: str) -> list[str]:
    """Create one application login in its group, with the group's role settings copied,
    and let it connect to the installation's database."""
    name = _ident(login.name)
    limit = "" if login.connection_limit is None else f" connection limit {login.connection_limit}"
    stmts = [f"create role {name} login{limit} in role {_ident(login.group)};"]
    # CONNECT per login, never for the keel_* groups: every agentkeel database on the
    # server shares them, so a grant to a group lets every other installation's logins in.
    stmts.append(f"grant connect on database {_ident(database)} to {name};")
    if login.group == "keel_watchdog":
        stmts.append(f"grant {', '.join(WATCHDOG_PREDEFINED)} to {name};")
    for s in settings:
        if s.role != login.group:
            continue
        stmt = f"alter role {name} set {s.name} = {_literal(s.value)};"
        stmts.append(
            stmt if s.min_version_num is None else _version_guarded(s.min_version_num, stmt)
        )
    return stmts


def _group_roles_block(groups: list[str], migrator: str) -> str:
    array = ", ".join(_literal(g) for g in groups)
    return f"""do $$
declare
    v_role text;
begin
    foreach v_role in array array[{array}] loop
        if not exists (select from pg_catalog.pg_roles as r where r.rolname = v_role) then
            execute format('create role %I nologin', v_role);
        end if;
        if pg_catalog.current_setting('server_version_num')::integer >= 160000 then
            execute format('grant %I to %I with admin true, inherit false, set false',
                v_role, {_literal(migrator)});
        end if;
    end loop;
end;
$$;"""


# psql's \\password reads the new password from /dev/tty, and without one from standard
# input: run with no terminal (a pipeline, a job) it reads an empty line and clears the
# password, exit 0. So the script stops first, before creating anything, when psql has no
# terminal; ON_ERROR_STOP makes that stop an exit status (3) however psql was called.
TERMINAL_GUARD = (
    "\\set ON_ERROR_STOP on",
    "\\set agentkeel_terminal `( : </dev/tty ) 2>/dev/null && echo on || echo off`",
    "\\if :agentkeel_terminal",
    "\\else",
    "do $$ begin raise exception using"
    " message = 'agentkeel bootstrap: psql has no terminal for its \\password prompts"
    " (without one it would clear the passwords): nothing was run',"
    " hint = 'Run the script from a terminal, or run agentkeel bootstrap --apply with"
    " --password-from-env LOGIN=VAR for each login.'; end $$;",
    "\\endif",
)


@dataclass(frozen=True)
class Plan:
    """What bootstrap does: statements in order; `\\password` marks a prompted password."""

    database: str
    migrator: str
    logins: list[Login]
    # On Citus the database exists already (with the extension, on every node, the nodes
    # added): the script runs in it, so that Citus creates every role on every node, and
    # hands the database to the migrator instead of creating it.
    citus: bool = False

    def statements(self, root: Path | None = None) -> list[str]:
        groups = keel_group_roles(root)
        settings = role_settings(root)
        database = (
            f"alter database {_ident(self.database)} owner to {_ident(self.migrator)};"
            if self.citus
            else f"create database {_ident(self.database)} owner {_ident(self.migrator)};"
        )
        stmts = [
            f"create role {_ident(self.migrator)} login createrole;",
            _group_roles_block(groups, self.migrator),
            f"grant keel_owner to {_ident(self.migrator)};",
            database,
            f"revoke connect on database {_ident(self.database)} from public;",
            f"revoke connect on database {_ident(self.database)} from "
            + ", ".join(_ident(g) for g in groups)
            + ";",
        ]
        for login in self.logins:
            stmts += login_statements(login, settings, self.database)
        return stmts

    def script(self, root: Path | None = None) -> str:
        settings = role_settings(root)
        stmts = self.statements(root)
        where = (
            [
                "-- agentkeel bootstrap for Citus: run once as a superuser on the coordinator,",
                f"-- in the database {self.database} (with the citus extension on every node",
                "-- and the workers added), so that Citus creates every role on every node:",
                f"--   psql -v ON_ERROR_STOP=1 -d {self.database} -f bootstrap.sql",
                "-- Roles are per node and cluster-wide on each: a role created from another",
                "-- database would exist on the coordinator only.",
            ]
            if self.citus
            else [
                "-- agentkeel bootstrap: run once as a superuser or a CREATEROLE role, e.g.",
                "--   psql -v ON_ERROR_STOP=1 -d postgres -f bootstrap.sql",
                "-- Roles and role settings are cluster-wide: every database of this server",
                "-- sees the logins below, and the keel_* group roles are shared by every",
                "-- agentkeel database on it.",
            ]
        )
        head = [
            *where,
            "-- No password is in this file: psql prompts (\\password).",
            "-- It stops before anything else when psql has no terminal to prompt on.",
            "--",
            f"-- The migrator {self.migrator}: LOGIN CREATEROLE and nothing else. CREATEROLE",
            "-- because every `agentkeel migrate up` re-applies policies/, which creates the",
            "-- NOLOGIN keel_* group roles if missing, grants keel_owner and sets role settings",
            "-- (alter role keel_* set ...): only CREATEROLE (16+: with ADMIN OPTION) may.",
        ]
        body = [*TERMINAL_GUARD, "", stmts[0], f"\\password {_ident(self.migrator)}", ""]
        body += [
            "-- The group roles logins join (policies/01_roles.sql creates them too, if",
            "-- missing); on 16+ the migrator gets ADMIN OPTION on them, not membership.",
            stmts[1],
            stmts[2],
            "",
            "-- The database, owned by the migrator (`migrate up` creates schema keel in it).",
            "-- Only the logins below may connect, each granted CONNECT by name: not PUBLIC,",
            "-- and not the keel_* group roles, which every agentkeel database on this server",
            "-- shares (a grant to keel_app would let another installation's app logins in,",
            "-- trusted as this one's; `agentkeel check` reports it: database_connect).",
            "-- A login added later: grant connect on database <this database> to <login>;",
            *(
                ["-- On Citus it exists already: it is handed to the migrator."]
                if self.citus
                else []
            ),
            *stmts[3:6],
            "",
            "-- Application logins, one per program (`agentkeel bootstrap --app-login NAME`,",
            "-- --worker-login, --agent-login, --watchdog-login). Role settings apply to the",
            "-- role a session logs in as, not to its groups: each login gets a copy of its",
            "-- group's settings from policies/06_role_settings.sql (override as needed, up",
            "-- to the caps `agentkeel check` reads from keel.settings). They are defaults a",
            "-- session may lift: `agentkeel watchdog` ends backends past the caps.",
        ]
        for login in self.logins:
            body += [f"-- {login.name}: {login.group}, {LOGIN_GROUPS[login.group]}"]
            body += login_statements(login, settings, self.database)
            body += [f"\\password {_ident(login.name)}", ""]
        named = {login.group for login in self.logins}
        for group in LOGIN_GROUPS:
            if group in named:
                continue
            example = Login(
                f"my_{group.removeprefix('keel_')}_login",
                group,
                AGENT_CONNECTION_LIMIT if group == "keel_agent" else None,
            )
            body += [f"-- Optional, {group}: {LOGIN_GROUPS[group]}"]
            for stmt in login_statements(example, settings, self.database):
                body += ["-- " + line for line in stmt.splitlines()]
            body += [f"-- \\password {example.name}", ""]
        if self.citus:
            body += [
                "-- Then, as a superuser: on Citus, migrations make the keel_* roles a",
                "-- database does not know yet on every node with ALTER ROLE ... NOSUPERUSER,",
                "-- and the distribution functions need one too:",
                f"--   agentkeel migrate up --dsn postgresql://postgres@HOST/{self.database}",
                f"--   agentkeel distribute --apply --dsn postgresql://postgres@HOST/"
                f"{self.database}",
            ]
        else:
            body += [
                "-- Then, as the migrator:",
                f"--   agentkeel migrate up --dsn postgresql://{self.migrator}@HOST/"
                f"{self.database}",
            ]
        body += [
            "--   agentkeel conformance --dsn <an application login> --owner-dsn <the migrator>",
        ]
        return "\n".join([*head, "", *body]) + "\n"


def apply(conn: psycopg.Connection, plan: Plan, passwords: dict[str, str]) -> list[str]:
    """Run the plan on an autocommit connection; a login named in `passwords` gets that
    password, sent as a SCRAM verifier computed here. Returns the statements run."""
    ran: list[str] = []
    for stmt in plan.statements():
        conn.execute(stmt.encode())
        ran.append(stmt)
        created = re.match(r'create role ("(?:[^"]|"")*"|[a-z_][a-z0-9_$]*) login', stmt)
        if created is None:
            continue
        name = next(
            n
            for n in [plan.migrator, *(lg.name for lg in plan.logins)]
            if _ident(n) == created.group(1)
        )
        if name in passwords:
            verifier = conn.pgconn.encrypt_password(
                passwords[name].encode(), name.encode(), b"scram-sha-256"
            ).decode()
            conn.execute(
                sql.SQL("alter role {} password {}").format(
                    sql.Identifier(name), sql.Literal(verifier)
                )
            )
            ran.append(f"alter role {_ident(name)} password '<SCRAM verifier>';")
    return ran
