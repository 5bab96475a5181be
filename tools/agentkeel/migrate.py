"""The migrator: versioned files once and in order, repeatable files on change.

policies/ files (ownership, grants, row-level security) also run again whenever anything
else is applied, because they are derived from what the other files create.

A history table with sha256 checksums records what was applied. One `up` is all or
nothing: every file runs in one transaction, under a lock on keel.migration_history that
no application role can take (polled, released at commit or rollback, so it also
serializes migrators through a transaction pooler). Files marked
`-- agentkeel:no-transaction` run after that transaction commits, one statement at a time,
followed by policies/ again in a last transaction; they need a direct connection, whose
application_name tells other migrators to wait meanwhile.
Everything `up` runs comes from `migration_phases`, which `plan` prints. An applied
versioned file whose checksum changed (drift), a database that knows migrations this
code does not, or a foreign `keel` schema is refused before anything runs.
"""

from __future__ import annotations

import enum
import hashlib
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Literal

import psycopg
from pglast import split
from psycopg import sql

from agentkeel import __version__
from agentkeel.exitcodes import ExitCode
from agentkeel.pooler import is_pooled

NO_TRANSACTION_MARKER = "-- agentkeel:no-transaction"
# A repeatable file whose SQL binds other objects when it is created (a SQL-standard
# function body) names them: "-- agentkeel:requires functions/other.sql". Files run in
# name order otherwise.
REQUIRES = re.compile(r"^--\s*agentkeel:requires\s+(\S+)\s*$", re.MULTILINE)
VERSIONED_NAME = re.compile(r"^(?P<version>\d{4})_(?P<slug>[a-z0-9]+(?:_[a-z0-9]+)*)\.sql$")
REPEATABLE_NAME = re.compile(r"^[a-z0-9]+(?:_[a-z0-9]+)*\.sql$")
# 'agentkel' in ASCII: the key of the advisory lock migrators share.
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
    # The migrator (a member of keel_owner) reads the table; any other keel role reads it
    # through keel.applied_migrations(), granted to them all.
    readable = conn.execute(
        "select pg_catalog.has_table_privilege('keel.migration_history', 'select')"
    ).fetchone()
    source = "keel.migration_history" if readable and readable[0] else "keel.applied_migrations()"
    rows = conn.execute(
        f"select name, kind, version, checksum, applied_at from {source}"
    ).fetchall()
    return {r[0]: AppliedMigration(r[0], r[1], r[2], r[3], r[4]) for r in rows}


@dataclass(frozen=True)
class KeelSchema:
    """The schema keel as found before agentkeel ever ran here (no migration_history)."""

    owner: str
    objects: tuple[str, ...]  # pg_describe_object of everything in it, sorted


@dataclass(frozen=True)
class Target:
    """What the planner needs to know about the database, read once under the lock."""

    history: dict[str, AppliedMigration]
    current_user: str
    foreign_schema: KeelSchema | None = None  # a keel schema without migration_history
    pooled: bool = False  # the connection goes through a pooler (PgBouncer, ...)


def read_target(conn: psycopg.Connection) -> Target:
    history = read_history(conn)
    row = conn.execute("select current_user::text").fetchone()
    current_user = row[0] if row else ""
    foreign = None
    if not history:
        owner = conn.execute(
            "select pg_catalog.pg_get_userbyid(nspowner) from pg_catalog.pg_namespace"
            " where nspname = 'keel'"
        ).fetchone()
        if owner is not None:
            # Everything `drop schema keel cascade` would drop: objects in the schema and
            # default privileges for it, as pg_depend links them to the namespace.
            objects = conn.execute(
                "select pg_catalog.pg_describe_object(d.classid, d.objid, d.objsubid)"
                " from pg_catalog.pg_depend as d"
                " where d.refclassid = 'pg_catalog.pg_namespace'::pg_catalog.regclass"
                " and d.refobjid = 'keel'::pg_catalog.regnamespace and d.deptype in ('n', 'a')"
                " order by 1"
            ).fetchall()
            foreign = KeelSchema(owner[0], tuple(r[0] for r in objects))
    return Target(history, current_user, foreign, is_pooled(conn))


FOREIGN_OBJECTS_SHOWN = 10


def _foreign_schema_problem(schema: KeelSchema, current_user: str) -> str | None:
    """agentkeel installs only into a keel schema it created, or an empty one of the migrator."""
    if schema.objects:
        shown = ", ".join(schema.objects[:FOREIGN_OBJECTS_SHOWN])
        more = len(schema.objects) - FOREIGN_OBJECTS_SHOWN
        return (
            f"foreign schema: keel already exists (owner {schema.owner}) and holds objects "
            f"agentkeel did not create: {shown}" + (f" and {more} more" if more > 0 else "") + "; "
            "installing would adopt them with their grants: drop or rename that schema "
            "(or install into another database)"
        )
    if schema.owner != current_user:
        return (
            f"foreign schema: an empty keel schema exists but is owned by {schema.owner}, "
            f"not by the migrating role {current_user}; its owner may have granted rights on "
            f"it: after checking, `alter schema keel owner to {current_user}`, or drop it"
        )
    return None


def make_plan(
    sources: list[MigrationFile],
    history: dict[str, AppliedMigration],
    target: Target | None = None,
) -> Plan:
    """What `up` would do, and every reason to refuse it. Pure: reads nothing itself."""
    entries: list[Entry] = []
    problems: list[str] = []
    if target is not None and target.foreign_schema is not None:
        problem = _foreign_schema_problem(target.foreign_schema, target.current_user)
        if problem:
            problems.append(problem)
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
        # A no-transaction file runs after the transaction of its run, so a later version
        # may be applied while it is still pending (it failed): that is not out of order.
        if (
            e.state is State.PENDING
            and e.source
            and e.source.transactional
            and e.source.version
            and e.source.version < newest
        ):
            problems.append(
                f"out of order: {e.name} is pending but version {newest} is already applied; "
                "versioned migrations are applied in order only"
            )

    plan = Plan(entries, problems)
    outside = [m.name for m in plan.to_apply if not m.transactional]
    if target is not None and target.pooled and outside:
        problems.append(
            f"pooled connection: {', '.join(outside)} must run outside a transaction, "
            "which is unsafe through a connection pooler (PgBouncer in transaction mode "
            "runs each statement wherever it likes and cannot hold the migration lock): "
            "connect directly to PostgreSQL to apply them"
        )
    return plan


def plan_for(conn: psycopg.Connection, root: Path) -> Plan:
    target = read_target(conn)
    return make_plan(load_sources(root), target.history, target)


# -- the lock ---------------------------------------------------------------------
#
# Migrators serialize on something only they may lock: keel.migration_history, in SHARE
# UPDATE EXCLUSIVE mode (self-conflicting; it does not conflict with the history inserts,
# nor with readers). No application role has a privilege on that table, so none can take
# or hold a lock on it; an advisory lock, which any role may take on any key, let an agent
# block every `migrate up`. Before the first install the table does not exist: that one
# run takes the transaction-level advisory lock instead.
#
# No-transaction files run after that transaction commits. While they run, the migrator's
# backend carries MARKER as its application_name (set before the commit, so no other
# migrator can get the lock and miss it); another migrator waits while a backend of a
# keel_owner member (a migrator or a superuser) carries it, or holds the advisory key, as
# migrators before this scheme did. A backend of any other role doing either is ignored.

HISTORY_TABLE = "keel.migration_history"
TABLE_LOCK = sql.SQL("lock table keel.migration_history in share update exclusive mode")
TABLE_LOCK_NOWAIT = sql.SQL(
    "lock table keel.migration_history in share update exclusive mode nowait"
)
XACT_LOCK = sql.SQL("select pg_catalog.pg_advisory_xact_lock({})").format(sql.Literal(LOCK_KEY))
MARKER = "agentkeel migrate: no-transaction files"
SET_MARKER = sql.SQL("select pg_catalog.set_config('application_name', {}, false)").format(
    sql.Literal(MARKER)
)
RESET_MARKER = sql.SQL("reset application_name")

# Another migrator at work: a keel_owner member's backend in this database that carries
# MARKER or holds the advisory key.
OTHER_MIGRATOR = sql.SQL(
    """select a.pid
from pg_catalog.pg_stat_activity as a
where a.datid = (select d.oid from pg_catalog.pg_database as d where d.datname = current_database())
    and a.pid <> pg_catalog.pg_backend_pid()
    and to_regrole('keel_owner') is not null
    and pg_catalog.pg_has_role(a.usesysid, 'keel_owner', 'member')
    and (
        a.application_name = {marker}
        or exists (
            select 1 from pg_catalog.pg_locks as l
            where l.pid = a.pid and l.locktype = 'advisory' and l.granted
                and l.database = a.datid and l.classid::bigint = {high}
                and l.objid::bigint = {low}
        )
    )
order by a.pid
limit 1"""
).format(
    marker=sql.Literal(MARKER),
    high=sql.Literal(LOCK_KEY >> 32),
    low=sql.Literal(LOCK_KEY & 0xFFFF_FFFF),
)
# The same check in a psql script: stop rather than run beside another migrator.
REFUSE_OTHER_MIGRATOR = sql.SQL(
    "do $$ begin if exists ({query}) then raise exception using errcode = '55P03',"
    " message = 'another agentkeel migrator is at work in this database: nothing was run';"
    " end if; end $$"
).format(query=OTHER_MIGRATOR)


def _first(conn: psycopg.Connection, query: sql.SQL | sql.Composed) -> int | None:
    row = conn.execute(query).fetchone()
    return int(row[0]) if row else None


# Who holds the migrators' lock this run asked for: the table lock or, on a fresh install,
# the advisory key.
LOCK_HOLDER = sql.SQL(
    """select l.pid
from pg_catalog.pg_locks as l
where l.granted and l.pid <> pg_catalog.pg_backend_pid()
    and (
        (l.relation = to_regclass({table}) and l.mode = 'ShareUpdateExclusiveLock')
        or (
            l.locktype = 'advisory'
            and l.database = (
                select d.oid from pg_catalog.pg_database as d where d.datname = current_database()
            )
            and l.classid::bigint = {high} and l.objid::bigint = {low}
        )
    )
limit 1"""
).format(
    table=sql.Literal(HISTORY_TABLE),
    high=sql.Literal(LOCK_KEY >> 32),
    low=sql.Literal(LOCK_KEY & 0xFFFF_FFFF),
)


def _try_lock(conn: psycopg.Connection) -> tuple[bool, int | None]:
    """One attempt, in the caller's transaction: (acquired, the backend pid in the way)."""
    row = conn.execute("select to_regclass(%s) is not null", (HISTORY_TABLE,)).fetchone()
    if row and row[0]:
        try:
            with conn.transaction():  # a savepoint: a refused NOWAIT leaves ours usable
                conn.execute(TABLE_LOCK_NOWAIT)
        except psycopg.errors.LockNotAvailable:
            return False, _first(conn, LOCK_HOLDER)
    else:
        row = conn.execute(
            "select pg_catalog.pg_try_advisory_xact_lock(%s)", (LOCK_KEY,)
        ).fetchone()
        if not (row and row[0]):
            return False, _first(conn, LOCK_HOLDER)
    other = _first(conn, OTHER_MIGRATOR)
    return other is None, other


@contextmanager
def locked_transaction(
    conn: psycopg.Connection,
    wait_seconds: float,
    on_wait: Callable[[int | None], None] | None = None,
    poll_seconds: float = 0.25,
) -> Iterator[None]:
    """A transaction holding the migrators' lock (see above), exclusive of every other
    migrator, also of one still running no-transaction files.

    Polls, one short transaction per attempt, until wait_seconds. The lock ends with the
    transaction (commit or rollback), so nothing is left held, also on a pooled backend.
    conn is in autocommit mode.
    """
    deadline = time.monotonic() + wait_seconds
    told = False
    while True:
        with conn.transaction():
            acquired, holder = _try_lock(conn)
            if acquired:
                yield
                return
        if not told and on_wait is not None:
            on_wait(holder)
            told = True
        if time.monotonic() >= deadline:
            raise MigrationError(
                f"another migrator (backend pid {holder}) held the migration lock for "
                f"{wait_seconds:g}s; nothing was applied: retry later or raise --lock-wait"
            )
        time.sleep(poll_seconds)


# -- what up runs and plan prints -------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One statement `up` executes and `plan` prints, exactly as composed here."""

    query: sql.SQL | sql.Composed
    file: MigrationFile | None = None
    statement: str | None = None  # the file's own statement, for error messages
    done: bool = False  # the history insert: after it, the file counts as applied
    cleanup: bool = False  # resets session settings: run even when a statement failed


@dataclass(frozen=True)
class Phase:
    """Steps in one transaction, or (transactional=False) one statement at a time."""

    transactional: bool
    steps: tuple[Step, ...]
    title: str


# Milliseconds since the file's first step, computed by the server, so that the same
# statement serves `up` and a psql replay of `plan`.
_STARTED = "agentkeel.file_started"
_ELAPSED_MS = sql.SQL(
    "((pg_catalog.date_part('epoch', pg_catalog.clock_timestamp())"
    " - pg_catalog.current_setting({})::double precision) * 1000)::integer"
).format(sql.Literal(_STARTED))


def _record(mig: MigrationFile) -> sql.Composed:
    return sql.SQL(
        "insert into keel.migration_history"
        " (name, kind, version, checksum, execution_ms, agentkeel_version)"
        " values ({}, {}, {}, {}, {}, {})"
        " on conflict on constraint migration_history_pkey do update set"
        " checksum = excluded.checksum, applied_at = now(), applied_by = current_user,"
        " execution_ms = excluded.execution_ms, agentkeel_version = excluded.agentkeel_version"
    ).format(
        sql.Literal(mig.name),
        sql.Literal(mig.kind),
        sql.SQL("null") if mig.version is None else sql.Literal(mig.version),
        sql.Literal(mig.checksum),
        _ELAPSED_MS,
        sql.Literal(__version__),
    )


def _file_steps(mig: MigrationFile, lock_timeout: str) -> list[Step]:
    scope = sql.SQL("local ") if mig.transactional else sql.SQL("")
    steps = [
        Step(sql.SQL("set {}lock_timeout = {}").format(scope, sql.Literal(lock_timeout)), mig),
        Step(sql.SQL("set {}search_path = pg_catalog, pg_temp").format(scope), mig),
        Step(
            sql.SQL(
                "select pg_catalog.set_config({}, pg_catalog.date_part('epoch',"
                " pg_catalog.clock_timestamp())::text, {})"
            ).format(sql.Literal(_STARTED), sql.Literal(mig.transactional)),
            mig,
        ),
    ]
    steps += [Step(sql.SQL(stmt.strip()), mig, stmt) for stmt in mig.statements()]
    steps.append(Step(_record(mig), mig, done=True))
    if not mig.transactional:
        steps += [
            Step(sql.SQL("reset lock_timeout"), mig, cleanup=True),
            Step(sql.SQL("reset search_path"), mig, cleanup=True),
            Step(sql.SQL("reset {}").format(sql.Identifier(*_STARTED.split("."))), cleanup=True),
        ]
    return steps


def migration_phases(todo: list[MigrationFile], lock_timeout: str) -> list[Phase]:
    """Everything `up` runs for these files, in order; `plan` prints the same.

    1. One transaction: the history table, then every transactional file in order
       (schema/, functions/, policies/). A failure rolls all of it back.
    2. After it commits, each no-transaction file, one statement at a time.
    3. If there were any: policies/ again in a last transaction, so that what the
       no-transaction files made is owned, granted and covered by row-level security too.
    """
    if not todo:
        return []
    main = [Step(sql.SQL(stmt)) for stmt in HISTORY_DDL]
    for mig in todo:
        if mig.transactional:
            main += _file_steps(mig, lock_timeout)
    phases = [Phase(True, tuple(main), "one transaction: every transactional file")]
    outside = [m for m in todo if not m.transactional]
    for mig in outside:
        phases.append(
            Phase(False, tuple(_file_steps(mig, lock_timeout)), f"{mig.name}: no transaction")
        )
    policies = [m for m in todo if m.transactional and m.name.startswith("policies/")]
    if outside and policies:
        again = [s for m in policies for s in _file_steps(m, lock_timeout)]
        phases.append(Phase(True, tuple(again), "policies/ again, after the no-transaction files"))
    return phases


def _fail(step: Step, phase: Phase, err: psycopg.Error) -> MigrationError:
    text = step.statement if step.statement is not None else step.query.as_string()
    first = text.strip().splitlines()[0][:80]
    what = "lock_timeout expired" if err.sqlstate == "55P03" else f"SQLSTATE {err.sqlstate}"
    if phase.transactional:
        rolled = "its transaction was rolled back"
    else:
        rolled = "earlier statements of it stay applied"
    where = step.file.name if step.file is not None else "the migration history"
    return MigrationError(
        f"{where} failed at `{first}` ({what}): {err.diag.message_primary or err}; {rolled}"
    )


def _run_steps(
    conn: psycopg.Connection, phase: Phase, on_done: Callable[[MigrationFile], None]
) -> None:
    try:
        for step in phase.steps:
            if step.cleanup:
                continue
            try:
                conn.execute(step.query)
            except psycopg.Error as err:
                raise _fail(step, phase, err) from err
            if step.done and step.file is not None:
                on_done(step.file)
    finally:
        if not phase.transactional:
            for step in phase.steps:
                if step.cleanup:
                    conn.execute(step.query)


def migrate_up(
    conn: psycopg.Connection,
    root: Path,
    *,
    lock_timeout: str = "10s",
    lock_wait: float = 300.0,
    on_wait: Callable[[int | None], None] | None = None,
    on_applied: Callable[[MigrationFile, int], None] | None = None,
) -> list[MigrationFile]:
    """Apply everything pending under the migrators' lock; returns what was applied."""
    if not conn.autocommit:
        raise ValueError("migrate_up needs a connection in autocommit mode")
    sources = load_sources(root)
    # Through a pooler, a server-side prepared statement may be missing on the next backend.
    prepare_threshold = conn.prepare_threshold
    conn.prepare_threshold = None
    marked = False
    applied: list[MigrationFile] = []
    timings: list[tuple[MigrationFile, int]] = []
    started = time.monotonic()

    def done(mig: MigrationFile) -> None:
        nonlocal started
        now = time.monotonic()
        timings.append((mig, int((now - started) * 1000)))
        started = now

    def report() -> None:
        for mig, ms in timings:
            if mig not in applied:
                applied.append(mig)
            if on_applied is not None:
                on_applied(mig, ms)
        timings.clear()

    try:
        with locked_transaction(conn, lock_wait, on_wait):
            # Read the database only under the lock: a migrator that waited sees what
            # the other one applied and has nothing left to do.
            target = read_target(conn)
            plan = make_plan(sources, target.history, target)
            if plan.problems:
                raise RefusedError("; ".join(plan.problems))
            phases = migration_phases(plan.to_apply, lock_timeout)
            if not phases:
                return []
            if len(phases) > 1:
                # No-transaction files run after this transaction: the marker (a direct
                # connection: the planner refused a pooled one) keeps other migrators out
                # until they are done. Set now, before the commit lets anyone in.
                conn.execute(SET_MARKER)
                marked = True
            started = time.monotonic()
            _run_steps(conn, phases[0], done)
        report()
        for phase in phases[1:]:
            started = time.monotonic()
            if phase.transactional:
                with conn.transaction():
                    _run_steps(conn, phase, done)
            else:
                _run_steps(conn, phase, done)
            report()
        return applied
    finally:
        timings.clear()
        if marked and not conn.closed and not conn.broken:
            conn.execute(RESET_MARKER)
        conn.prepare_threshold = prepare_threshold


def plan_sql(todo: list[MigrationFile], lock_timeout: str, conn: psycopg.Connection) -> str:
    """The SQL `up` would run, as a psql-ready script a DBA can review or run by hand.

    The statements are `migration_phases`, rendered by psycopg as `up` sends them; only
    the lock differs: `up` polls its lock under --lock-wait, the script waits for it, then
    stops if another migrator is still running no-transaction files.
    """
    row = conn.execute("select to_regclass(%s) is not null", (HISTORY_TABLE,)).fetchone()
    lock = TABLE_LOCK if row and row[0] else XACT_LOCK
    phases = migration_phases(todo, lock_timeout)
    out = [f"-- agentkeel {__version__}: pending migrations", ""]
    for index, phase in enumerate(phases):
        out.append(f"-- {phase.title}")
        if phase.transactional:
            out.append("begin;")
        if index == 0:
            out.append(f"{lock.as_string(conn)};")
            out.append(f"{REFUSE_OTHER_MIGRATOR.as_string(conn)};")
            if len(phases) > 1:
                out.append(f"{SET_MARKER.as_string(conn)};")
        current: MigrationFile | None = None
        for step in phase.steps:
            if step.file is not None and step.file is not current:
                current = step.file
                out.append(f"-- {current.name} ({current.kind}, sha256 {current.checksum})")
            out.append(f"{step.query.as_string(conn)};")
        if phase.transactional:
            out.append("commit;")
        out.append("")
    if len(phases) > 1:
        out.append(f"{RESET_MARKER.as_string(conn)};")
    return "\n".join(out)
