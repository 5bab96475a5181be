"""The migrator: versioned files once and in order, repeatable files on change.

policies/ files (ownership, grants, row-level security) also run again whenever anything
else is applied, because they are derived from what the other files create.

A history table with sha256 checksums records what was applied. Concurrent
migrators serialize on a session advisory lock taken by polling; each file runs
in its own transaction under lock_timeout. An applied versioned file whose
checksum changed (drift), or a database that knows migrations this code does
not, is refused before anything runs.
"""

from __future__ import annotations

import enum
import hashlib
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Literal

import psycopg
from pglast import split
from psycopg import sql

from agentkeel import __version__
from agentkeel.exitcodes import ExitCode

NO_TRANSACTION_MARKER = "-- agentkeel:no-transaction"
# A repeatable file whose SQL binds other objects when it is created (a SQL-standard
# function body) names them: "-- agentkeel:requires functions/other.sql". Files run in
# name order otherwise.
REQUIRES = re.compile(r"^--\s*agentkeel:requires\s+(\S+)\s*$", re.MULTILINE)
VERSIONED_NAME = re.compile(r"^(?P<version>\d{4})_(?P<slug>[a-z0-9]+(?:_[a-z0-9]+)*)\.sql$")
REPEATABLE_NAME = re.compile(r"^[a-z0-9]+(?:_[a-z0-9]+)*\.sql$")
# 'agentkel' in ASCII: the key of the session advisory lock migrators share.
LOCK_KEY = int.from_bytes(b"agentkel", "big") & 0x7FFF_FFFF_FFFF_FFFF

HISTORY_DDL = (
    "create schema if not exists keel",
    """create table if not exists keel.migration_history (
    name text not null,
    kind text not null,
    version integer,
    checksum text not null,
    applied_at timestamptz not null default now(),
    applied_by text not null default current_user,
    execution_ms integer not null,
    agentkeel_version text not null,
    constraint migration_history_pkey primary key (name),
    constraint migration_history_kind_check check (kind in ('versioned', 'repeatable')),
    constraint migration_history_version_check check ((kind = 'versioned') = (version is not null))
)""",
    "comment on table keel.migration_history is "
    "'Applied agentkeel migrations with sha256 checksums, written by agentkeel migrate.'",
)

Kind = Literal["versioned", "repeatable"]


class MigrationError(Exception):
    """Base of everything the migrator refuses or fails to do."""

    exit_code: int = ExitCode.DATABASE_ERROR


class RefusedError(MigrationError):
    """The database and the code disagree (drift, newer database, out of order)."""

    exit_code = ExitCode.REFUSED


class SourceError(MigrationError):
    """The migration files themselves are malformed."""

    exit_code = ExitCode.USAGE


@dataclass(frozen=True)
class MigrationFile:
    kind: Kind
    name: str  # e.g. "schema/0003_tenants.sql": the key in the history table
    version: int | None
    sql: str
    checksum: str
    transactional: bool

    def statements(self) -> list[str]:
        return [s for s in split(self.sql, with_parser=True) if s.strip()]


@dataclass(frozen=True)
class AppliedMigration:
    name: str
    kind: Kind
    version: int | None
    checksum: str
    applied_at: datetime


class State(enum.Enum):
    APPLIED = "applied"
    PENDING = "pending"
    CHANGED = "changed"  # repeatable file changed since applied: re-applied by up
    REAPPLY = "reapply"  # policies/ file, unchanged, re-run because something else runs
    DRIFT = "drift"  # versioned file changed since applied: refused
    UNKNOWN = "unknown"  # in the database, not in this code
    REMOVED = "removed"  # repeatable file no longer shipped


@dataclass(frozen=True)
class Entry:
    name: str
    kind: Kind
    state: State
    source: MigrationFile | None
    applied: AppliedMigration | None


@dataclass
class Plan:
    entries: list[Entry]
    problems: list[str] = field(default_factory=list)

    @property
    def to_apply(self) -> list[MigrationFile]:
        return [
            e.source
            for e in self.entries
            if e.source is not None and e.state in (State.PENDING, State.CHANGED, State.REAPPLY)
        ]


def checksum(text: str) -> str:
    """sha256 of the file with line endings normalized, so a git checkout on Windows matches."""
    return hashlib.sha256(text.replace("\r\n", "\n").encode("utf-8")).hexdigest()


def _read(path: Path, kind: Kind, name: str, version: int | None) -> MigrationFile:
    text = path.read_text(encoding="utf-8")
    first_line = text.lstrip().splitlines()[0] if text.strip() else ""
    return MigrationFile(
        kind=kind,
        name=name,
        version=version,
        sql=text,
        checksum=checksum(text),
        transactional=first_line.strip() != NO_TRANSACTION_MARKER,
    )


def load_sources(root: Path) -> list[MigrationFile]:
    """schema/ in version order, then functions/ and policies/ in name order."""
    versioned: list[MigrationFile] = []
    seen: dict[int, str] = {}
    for path in sorted((root / "schema").glob("*.sql")):
        match = VERSIONED_NAME.match(path.name)
        if not match:
            raise SourceError(
                f"schema/{path.name}: versioned migrations are named NNNN_lower_snake.sql"
            )
        version = int(match["version"])
        if version in seen:
            raise SourceError(
                f"schema/{path.name}: version {version} is also used by {seen[version]}"
            )
        seen[version] = f"schema/{path.name}"
        versioned.append(_read(path, "versioned", f"schema/{path.name}", version))
    repeatable: list[MigrationFile] = []
    for folder in ("functions", "policies"):
        files = []
        for path in sorted((root / folder).glob("*.sql")):
            if not REPEATABLE_NAME.match(path.name):
                raise SourceError(
                    f"{folder}/{path.name}: repeatable files are named lower_snake.sql"
                )
            files.append(_read(path, "repeatable", f"{folder}/{path.name}", None))
        repeatable.extend(_dependency_order(files, {m.name for m in repeatable}))
    return sorted(versioned, key=lambda m: m.version or 0) + repeatable


def _dependency_order(files: list[MigrationFile], earlier: set[str]) -> list[MigrationFile]:
    """Name order, except that a file comes after the files it requires."""
    by_name = {m.name: m for m in files}
    ordered: list[MigrationFile] = []
    placed: set[str] = set()
    visiting: set[str] = set()

    def place(mig: MigrationFile) -> None:
        if mig.name in placed:
            return
        if mig.name in visiting:
            raise SourceError(f"{mig.name}: agentkeel:requires forms a cycle")
        visiting.add(mig.name)
        for required in REQUIRES.findall(mig.sql):
            if required in by_name:
                place(by_name[required])
            elif required not in earlier:
                raise SourceError(f"{mig.name}: requires {required}, which is not an earlier file")
        visiting.discard(mig.name)
        placed.add(mig.name)
        ordered.append(mig)

    for mig in files:
        place(mig)
    return ordered


def read_history(conn: psycopg.Connection) -> dict[str, AppliedMigration]:
    """What the database says was applied; empty when agentkeel never ran here."""
    exists = conn.execute("select to_regclass('keel.migration_history') is not null").fetchone()
    if not exists or not exists[0]:
        return {}
    rows = conn.execute(
        "select name, kind, version, checksum, applied_at from keel.migration_history"
    ).fetchall()
    return {r[0]: AppliedMigration(r[0], r[1], r[2], r[3], r[4]) for r in rows}


def make_plan(sources: list[MigrationFile], history: dict[str, AppliedMigration]) -> Plan:
    entries: list[Entry] = []
    problems: list[str] = []
    for src in sources:
        applied = history.get(src.name)
        if applied is None:
            state = State.PENDING
        elif applied.checksum == src.checksum:
            state = State.APPLIED
        elif src.kind == "repeatable":
            state = State.CHANGED
        else:
            state = State.DRIFT
            problems.append(
                f"drift: {src.name} was changed after it was applied "
                f"(applied sha256 {applied.checksum[:12]}, file sha256 {src.checksum[:12]}); "
                "released migrations are append-only: restore the file and add a new migration"
            )
        entries.append(Entry(src.name, src.kind, state, src, applied))

    # Ownership, grants and row-level security are derived from the catalog: whenever
    # anything else runs (a new table, a re-created function), every policies/ file runs too.
    if any(e.state in (State.PENDING, State.CHANGED) for e in entries):
        entries = [
            Entry(e.name, e.kind, State.REAPPLY, e.source, e.applied)
            if e.state is State.APPLIED and e.name.startswith("policies/")
            else e
            for e in entries
        ]

    known = {s.name for s in sources}
    for applied in sorted(history.values(), key=lambda a: (a.kind, a.version or 0, a.name)):
        if applied.name in known:
            continue
        if applied.kind == "versioned":
            entries.append(Entry(applied.name, applied.kind, State.UNKNOWN, None, applied))
            problems.append(
                f"newer database: {applied.name} is applied here but unknown to agentkeel "
                f"{__version__}; upgrade agentkeel before migrating this database"
            )
        else:
            entries.append(Entry(applied.name, applied.kind, State.REMOVED, None, applied))

    applied_versions = [a.version for a in history.values() if a.kind == "versioned" and a.version]
    newest = max(applied_versions, default=0)
    for e in entries:
        if e.state is State.PENDING and e.source and e.source.version and e.source.version < newest:
            problems.append(
                f"out of order: {e.name} is pending but version {newest} is already applied; "
                "versioned migrations are applied in order only"
            )
    return Plan(entries, problems)


def plan_for(conn: psycopg.Connection, root: Path) -> Plan:
    return make_plan(load_sources(root), read_history(conn))


def _lock_holder(conn: psycopg.Connection) -> int | None:
    row = conn.execute(
        "select pid from pg_locks where locktype = 'advisory' and granted"
        " and database = (select oid from pg_database where datname = current_database())"
        " and classid::bigint = %s and objid::bigint = %s and pid <> pg_backend_pid() limit 1",
        (LOCK_KEY >> 32, LOCK_KEY & 0xFFFF_FFFF),
    ).fetchone()
    return row[0] if row else None


def acquire_lock(
    conn: psycopg.Connection,
    wait_seconds: float,
    on_wait: Callable[[int | None], None] | None = None,
    poll_seconds: float = 0.25,
) -> None:
    """Take the migrators' advisory lock, polling pg_try_advisory_lock until wait_seconds."""
    deadline = time.monotonic() + wait_seconds
    told = False
    while True:
        row = conn.execute("select pg_try_advisory_lock(%s)", (LOCK_KEY,)).fetchone()
        if row and row[0]:
            return
        if not told and on_wait is not None:
            on_wait(_lock_holder(conn))
            told = True
        if time.monotonic() >= deadline:
            holder = _lock_holder(conn)
            raise MigrationError(
                f"another migrator (backend pid {holder}) held the migration lock for "
                f"{wait_seconds:g}s; nothing was applied: retry later or raise --lock-wait"
            )
        time.sleep(poll_seconds)


def release_lock(conn: psycopg.Connection) -> None:
    conn.execute("select pg_advisory_unlock(%s)", (LOCK_KEY,))


def _session_settings(lock_timeout: str) -> list[sql.Composed | sql.SQL]:
    return [
        sql.SQL("set local lock_timeout = {}").format(sql.Literal(lock_timeout)),
        sql.SQL("set local search_path = pg_catalog, pg_temp"),
    ]


def _record(conn: psycopg.Connection, mig: MigrationFile, elapsed_ms: int) -> None:
    conn.execute(
        "insert into keel.migration_history"
        " (name, kind, version, checksum, execution_ms, agentkeel_version)"
        " values (%s, %s, %s, %s, %s, %s)"
        " on conflict on constraint migration_history_pkey do update set"
        " checksum = excluded.checksum, applied_at = now(), applied_by = current_user,"
        " execution_ms = excluded.execution_ms, agentkeel_version = excluded.agentkeel_version",
        (mig.name, mig.kind, mig.version, mig.checksum, elapsed_ms, __version__),
    )


def _fail(mig: MigrationFile, stmt: str, err: psycopg.Error) -> MigrationError:
    first = stmt.strip().splitlines()[0][:80]
    what = "lock_timeout expired" if err.sqlstate == "55P03" else f"SQLSTATE {err.sqlstate}"
    rolled = "it was rolled back" if mig.transactional else "earlier statements of it stay applied"
    return MigrationError(
        f"{mig.name} failed at `{first}` ({what}): {err.diag.message_primary or err}; {rolled}"
    )


def _execute_all(conn: psycopg.Connection, mig: MigrationFile) -> None:
    for stmt in mig.statements():
        try:
            conn.execute(stmt.encode("utf-8"))
        except psycopg.Error as err:
            raise _fail(mig, stmt, err) from err


def apply_one(conn: psycopg.Connection, mig: MigrationFile, lock_timeout: str) -> int:
    """Apply one file and record it; returns milliseconds taken. conn is in autocommit mode."""
    started = time.monotonic()
    if mig.transactional:
        with conn.transaction():
            for setting in _session_settings(lock_timeout):
                conn.execute(setting)
            _execute_all(conn, mig)
            elapsed = int((time.monotonic() - started) * 1000)
            _record(conn, mig, elapsed)
        return elapsed
    conn.execute(sql.SQL("set lock_timeout = {}").format(sql.Literal(lock_timeout)))
    try:
        _execute_all(conn, mig)
    finally:
        conn.execute("reset lock_timeout")
    elapsed = int((time.monotonic() - started) * 1000)
    _record(conn, mig, elapsed)
    return elapsed


def bootstrap(conn: psycopg.Connection) -> None:
    with conn.transaction():
        for stmt in HISTORY_DDL:
            conn.execute(stmt)


def migrate_up(
    conn: psycopg.Connection,
    root: Path,
    *,
    lock_timeout: str = "10s",
    lock_wait: float = 300.0,
    on_wait: Callable[[int | None], None] | None = None,
    on_applied: Callable[[MigrationFile, int], None] | None = None,
) -> list[MigrationFile]:
    """Apply everything pending under the advisory lock; returns what was applied."""
    if not conn.autocommit:
        raise ValueError("migrate_up needs a connection in autocommit mode")
    sources = load_sources(root)
    acquire_lock(conn, lock_wait, on_wait)
    try:
        # Read the history only under the lock: a migrator that waited sees what
        # the other one applied and has nothing left to do.
        plan = make_plan(sources, read_history(conn))
        if plan.problems:
            raise RefusedError("; ".join(plan.problems))
        todo = plan.to_apply
        if todo:
            bootstrap(conn)
        for mig in todo:
            elapsed = apply_one(conn, mig, lock_timeout)
            if on_applied is not None:
                on_applied(mig, elapsed)
        return todo
    finally:
        release_lock(conn)


def plan_sql(todo: Iterable[MigrationFile], lock_timeout: str) -> str:
    """The SQL `up` would run, as a psql-ready script a DBA can review or run by hand."""
    out = [
        f"-- agentkeel {__version__}: pending migrations",
        "-- History table (created by agentkeel migrate up if missing):",
        *(f"{stmt};" for stmt in HISTORY_DDL),
        "",
    ]
    for mig in todo:
        out.append(f"-- {mig.name} ({mig.kind}, sha256 {mig.checksum})")
        if mig.transactional:
            out.append("begin;")
            out.append(f"set local lock_timeout = '{lock_timeout}';")
            out.append("set local search_path = pg_catalog, pg_temp;")
        out.extend(f"{stmt.strip()};" for stmt in mig.statements())
        version = "null" if mig.version is None else str(mig.version)
        out.append(
            "insert into keel.migration_history"
            " (name, kind, version, checksum, execution_ms, agentkeel_version)"
            f" values ('{mig.name}', '{mig.kind}', {version}, '{mig.checksum}', 0,"
            f" '{__version__}')"
            " on conflict on constraint migration_history_pkey do update set"
            " checksum = excluded.checksum, applied_at = now();"
        )
        if mig.transactional:
            out.append("commit;")
        out.append("")
    return "\n".join(out)
