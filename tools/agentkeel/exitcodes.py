"""Every exit code agentkeel uses, in one place: the CLI, the migrator and the suite's plugin.

The exit-code table of docs/errors.md is `markdown_table()` (tests/test_docs.py compares them).
pytest's own codes 2-5 (interrupted, internal error, usage error, no tests collected) are
never reused for what the suite's plugin reports itself, so `agentkeel conformance` can map
them without ambiguity.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """An agentkeel exit code; each member's docstring is its docs/errors.md entry."""

    def __new__(cls, value: int, description: str) -> ExitCode:
        member = int.__new__(cls, value)
        member._value_ = value
        member.__doc__ = description
        return member

    @property
    def description(self) -> str:
        return self.__doc__ or ""

    OK = (0, "success: done, up to date, valid, no finding, every test passed or was skipped")
    FINDINGS = (
        1,
        "findings: `check` or `lint` found problems, a conformance test failed (with "
        "`--strict`, also a guarantee only partly tested), "
        "`migrate validate` found migrations pending",
    )
    USAGE = (
        2,
        "bad usage: an unknown option, no `--dsn` / `AGENTKEEL_DSN` where a database must be "
        "named, a DSN that is not a connection string or has an option value libpq refuses "
        "before connecting (`port=abc`, `sslmode=bogus`), malformed migration files, a pytest "
        "usage error, no test selected, a `worker --app` that cannot be imported or names no "
        "Registry",
    )
    REFUSED = (
        3,
        "refused before anything ran: drift (an applied versioned file changed), a database "
        "newer than this agentkeel, a pending file older than an applied one, no-transaction "
        "files pending through a connection pooler (`migrate status` and `plan` report each "
        "of these with this code too), a JetStream duplicate window shorter than the relay's "
        "lease, a `worker` registry whose workflow lacks the edges the worker writes",
    )
    DATABASE_ERROR = (
        4,
        "the database failed the work: a migration failed (rolled back), the migration lock "
        "wait ran out, a statement failed",
    )
    TOOL_MISSING = (
        5,
        "something to run is missing: PostgreSQL server binaries for the embedded cluster (or "
        "it could not start), squawk for `lint`, the citus extension for `distribute --apply`, "
        "pgbench for `bench --driver pgbench`, procrastinate for "
        "`bench --workload peer-procrastinate`",
    )
    CONNECTION = (
        6,
        "cannot connect: unreachable host, refused or timed-out connection, wrong password, "
        "no such role or database; `relay --once`: the sink could not be reached",
    )
    PERMISSION = (
        7,
        "connected, but the role lacks a privilege it needs (the suite's `--dsn` role must be a "
        "member of keel_app, keel_worker or keel_owner)",
    )
    SCHEMA_MISSING = (
        8,
        "the database has no agentkeel schema: run `agentkeel migrate up` first (or the "
        "suite's `--migrate`)",
    )
    INTERNAL = (
        70,
        "internal error (a bug in agentkeel): one line; `agentkeel --debug ...` prints the "
        "traceback",
    )
    INTERRUPTED = (
        130,
        "interrupted (Ctrl-C, SIGINT or SIGTERM), after the cleanup ran: embedded cluster "
        "removed, the suite's tenants, workflow and roles deleted",
    )


class AgentkeelError(Exception):
    """An expected failure: one line on stderr and its exit code."""

    def __init__(self, message: str, code: ExitCode) -> None:
        super().__init__(message)
        self.code = code


def lookup(value: int) -> ExitCode | None:
    """The member with this value, if any."""
    return next((member for member in ExitCode if member.value == value), None)


def markdown_table() -> str:
    """The exit-code table of docs/errors.md, generated from the enum."""
    lines = ["| code | name | meaning |", "|---|---|---|"]
    for member in ExitCode:
        lines.append(f"| {member.value} | `{member.name}` | {member.description} |")
    return "\n".join(lines) + "\n"
