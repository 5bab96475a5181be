"""`agentkeel bench` workloads: the guarded paths against a plain-SQL floor doing the same
writes with no function, no row-level security and no fencing.

Each workload has two sides. The keel side runs as temporary login roles in keel_worker
(claims) and keel_app, so row-level security, the definer functions, fencing, events and
the payload checks all count; the floor side runs as the --dsn role on plain tables in a
schema of its own (`agentkeel_bench_<id>`, dropped afterwards). Runs alternate floor and
keel (floor first, then keel first, ...) so that noise on the machine hits both; every run
starts from freshly loaded, vacuumed tables unless the run is sustained. Both sides use
prepared statements (psycopg prepares a statement from its fifth execution) and one
connection per worker thread.
"""

from __future__ import annotations

import functools
import hashlib
import json
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import conninfo, sql

from agentkeel.client import set_tenant_context

Side = str  # "floor" | "keel"
SLICE_S = 1.0  # throughput is reported per slice of this many seconds


@dataclass
class Run:
    """One timed run of one side of a workload."""

    workload: str
    side: Side
    workers: int
    seconds: float
    ops: int
    latencies_ms: list[float] = field(repr=False)
    slices: list[int]  # ops completed in each SLICE_S of the run
    # (seconds into the run, table bytes, index bytes, dead tuples) of the side's tables,
    # sampled once per slice: the growth and bloat of a sustained run
    storage: list[tuple[float, int, int, int]] = field(default_factory=list)
    driver: str = "python"  # or "pgbench" (agentkeel.bench_pgbench)
    # keel side, pgbench driver, when track_functions could be set: per keel function,
    # (calls, total ms, self ms) in the server during the run (pg_stat_user_functions)
    functions: dict[str, tuple[int, float, float]] = field(default_factory=dict)
    # keel side, where pg_stat_statements is loaded: the statements the run's logins ran
    # (those inside keel functions too), as (query, calls, total ms), dearest first
    statements: list[tuple[str, int, float]] = field(default_factory=list)
    # a claim run that used every row loaded for it before its end: its ops/s is a floor
    # of what it could do, not a measurement
    exhausted: bool = False

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float:
        if not self.latencies_ms:
            return 0.0
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def as_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "side": self.side,
            "driver": self.driver,
            "workers": self.workers,
            "exhausted": self.exhausted,
            "seconds": round(self.seconds, 3),
            "ops": self.ops,
            "ops_per_s": round(self.ops_per_s, 1),
            "p50_ms": round(self.percentile(0.50), 3),
            "p99_ms": round(self.percentile(0.99), 3),
            "slices": self.slices,
            "storage": [
                {"t": round(t, 1), "table_bytes": tb, "index_bytes": ib, "dead_tuples": dead}
                for t, tb, ib, dead in self.storage
            ],
            "functions": [
                {
                    "function": name,
                    "calls": calls,
                    "total_ms": round(total, 3),
                    "self_ms": round(own, 3),
                    "total_us_per_call": round(1000 * total / calls, 1) if calls else None,
                }
                for name, (calls, total, own) in sorted(
                    self.functions.items(), key=lambda item: -item[1][2]
                )
            ],
            "statements": [
                {"query": query, "calls": calls, "total_ms": round(total, 3)}
                for query, calls, total in self.statements
            ],
        }

    def minute_ratio(self) -> float | None:
        """Throughput in the last minute over the first, for runs of at least two minutes."""
        per_minute = int(60 / SLICE_S)
        if len(self.slices) < 2 * per_minute or not sum(self.slices[:per_minute]):
            return None
        return sum(self.slices[-per_minute:]) / sum(self.slices[:per_minute])


@dataclass(frozen=True)
class Summary:
    """A workload's figures at one worker count: the median run of each side."""

    workload: str
    workers: int
    floor: Run
    keel: Run
    driver: str = "python"

    @property
    def ratio(self) -> float:
        return self.keel.ops_per_s / self.floor.ops_per_s if self.floor.ops_per_s else 0.0


def summarize(runs: list[Run]) -> list[Summary]:
    """The median run (by ops/s) of each side, per workload, worker count and driver."""
    keys = dict.fromkeys((r.workload, r.workers, r.driver) for r in runs)
    out = []
    for key in keys:

        def median(side: Side, key: tuple[str, int, str] = key) -> Run:
            mine = sorted(
                (r for r in runs if (r.workload, r.workers, r.driver, r.side) == (*key, side)),
                key=lambda r: r.ops_per_s,
            )
            return mine[(len(mine) - 1) // 2]

        out.append(Summary(key[0], key[1], median("floor"), median("keel"), key[2]))
    return out


# -- the bench's own world: roles, a tenant, a workflow, the floor's schema ------------


@dataclass(frozen=True)
class World:
    dsn: str  # the --dsn role: owner of the floor schema, loads keel rows as the owner
    worker_dsn: str  # a keel_worker login
    app_dsn: str  # a keel_app login
    tenant: uuid.UUID
    workflow: str
    floor: str  # the floor's schema
    logins: tuple[str, ...] = ()  # the keel side's login roles
    statements: bool = False  # pg_stat_statements is loaded and its view is in the database


@contextmanager
def bench_world(dsn: str) -> Iterator[World]:
    """Make the roles, tenant, workflow and floor schema; remove them all afterwards."""
    tag = uuid.uuid4().hex[:8]
    worker, app = f"bench_worker_{tag}", f"bench_app_{tag}"
    tenant, workflow, floor = uuid.uuid4(), f"bench-{tag}", f"agentkeel_bench_{tag}"
    # A password of their own: a server that asks for one lets them in too.
    password = secrets.token_urlsafe(24)
    with psycopg.connect(dsn, autocommit=True) as owner:
        superuser = owner.execute("select rolsuper from pg_roles where rolname = current_user")
        may_track = bool((superuser.fetchone() or (False,))[0])
        statements = may_track and _statements_loaded(owner)
        for role, group in ((worker, "keel_worker"), (app, "keel_app")):
            owner.execute(
                sql.SQL("create role {} login password {} in role {}").format(
                    sql.Identifier(role), sql.Literal(password), sql.Identifier(group)
                )
            )
            # What a superuser may set for them: the server time of their calls per
            # function, and of the statements inside the functions.
            tracked = ["track_functions"] if may_track else []
            tracked += ["pg_stat_statements.track"] if statements else []
            for setting in tracked:
                owner.execute(
                    sql.SQL("alter role {} set {} = 'all'").format(
                        sql.Identifier(role), sql.Identifier(*setting.split("."))
                    )
                )
    made_extension = False
    try:
        with psycopg.connect(dsn, autocommit=True) as owner:
            if (
                statements
                and owner.execute(
                    "select 1 from pg_extension where extname = 'pg_stat_statements'"
                ).fetchone()
                is None
            ):
                owner.execute("create extension pg_stat_statements")
                made_extension = True
            owner.execute(
                "select keel.define_workflow(%s, 1, 'queued', %s::jsonb)",
                (workflow, '[["queued", "done"], ["queued", "a"], ["a", "b"], ["b", "a"]]'),
            )
            with owner.transaction():
                set_tenant_context(owner, tenant)
                owner.execute("select keel.create_tenant(%s, 'agentkeel-bench')", (tenant,))
            owner.execute(sql.SQL(FLOOR_DDL).format(schema=sql.Identifier(floor)))
        yield World(
            dsn,
            conninfo.make_conninfo(dsn, user=worker, password=password),
            conninfo.make_conninfo(dsn, user=app, password=password),
            tenant,
            workflow,
            floor,
            (worker, app),
            statements,
        )
    finally:
        with psycopg.connect(dsn, autocommit=True) as owner:
            if made_extension:
                owner.execute("drop extension if exists pg_stat_statements")
            owner.execute(sql.SQL("drop schema if exists {} cascade").format(sql.Identifier(floor)))
            with owner.transaction():
                set_tenant_context(owner, tenant)
                owner.execute("set local keel.purge = on")
                owner.execute("delete from keel.tenants where tenant_id = %s", (tenant,))
            owner.execute("delete from keel.workflows where workflow = %s", (workflow,))
            for role in (worker, app):
                owner.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(role)))


# The floor: what a team writes without agentkeel. Same columns that matter, same indexes
# (a partial claim index), no RLS, no functions, no fencing beyond a token compare.
FLOOR_DDL = """
create schema {schema};
create table {schema}.jobs (
    tenant_id uuid not null,
    id uuid not null default gen_random_uuid(),
    state text not null default 'queued',
    version bigint not null default 1,
    token bigint not null default 0,
    lease_owner text,
    lease_expires_at timestamptz,
    wake_at timestamptz default now(),
    updated_at timestamptz not null default now(),
    primary key (tenant_id, id)
);
create index on {schema}.jobs (wake_at) where wake_at is not null;
create table {schema}.events (
    tenant_id uuid not null,
    job_id uuid not null,
    seq bigint not null,
    to_state text not null,
    payload jsonb not null default '{{}}',
    created_at timestamptz not null default now(),
    primary key (tenant_id, job_id, seq)
);
create table {schema}.outbox (
    tenant_id uuid not null,
    id uuid not null default gen_random_uuid(),
    job_id uuid,
    topic text not null,
    payload jsonb not null,
    created_at timestamptz not null default now(),
    primary key (tenant_id, id)
);
create table {schema}.operations (
    tenant_id uuid not null,
    key text not null,
    input_hash text not null,
    state text not null default 'reserved',
    created_at timestamptz not null default now(),
    primary key (tenant_id, key)
)
"""


# -- workloads -----------------------------------------------------------------------------

# An operation: called in a loop by one worker thread on its own connection; returns how
# many logical operations it completed (0 when there was nothing to do).
Op = Callable[[psycopg.Connection], int]


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    # (world, side, rows) -> load what a run needs; rows = operations it may perform
    load: Callable[[World, Side, int], None]
    # (world, side, worker index) -> the worker's operation
    op: Callable[[World, Side, int], Op]
    batch: int = 1  # logical operations per call
    default: bool = True  # run when no --workload is named


def _load_jobs(world: World, side: Side, rows: int, state: str = "queued") -> None:
    """rows due jobs (tasks), or finished ones (state done: off the claim index). The
    n-th due job of a side (from 0) has the id md5('bench-<n>'): the transition workload's
    worker n moves that one (the pgbench driver finds it from its client id)."""
    wake = "now()" if state != "done" else "null"
    ident = "md5('bench-' || (g - 1))::uuid" if state != "done" else "gen_random_uuid()"
    with psycopg.connect(world.dsn, autocommit=True) as owner:
        if side == "floor":
            owner.execute(
                sql.SQL(
                    "insert into {}.jobs (tenant_id, id, state, wake_at)"
                    " select %s, {}, %s, {} from generate_series(1, %s) as g"
                ).format(sql.Identifier(world.floor), sql.SQL(ident), sql.SQL(wake)),
                (world.tenant, state, rows),
            )
        else:
            with owner.transaction():
                set_tenant_context(owner, world.tenant)
                owner.execute(
                    sql.SQL(
                        "insert into keel.tasks"
                        " (tenant_id, task_id, workflow, workflow_version, state, wake_at)"
                        " select %s, {}, %s, 1, %s, {} from generate_series(1, %s) as g"
                    ).format(sql.SQL(ident), sql.SQL(wake)),
                    (world.tenant, world.workflow, state, rows),
                )


def _clear(world: World, vacuum: bool = True) -> None:
    """Empty both sides and (by default) vacuum, so that each run starts alike."""
    with psycopg.connect(world.dsn, autocommit=True) as owner:
        for table in ("jobs", "events", "outbox", "operations"):
            owner.execute(
                sql.SQL("truncate {}.{}").format(sql.Identifier(world.floor), sql.Identifier(table))
            )
        peer = sql.Identifier(world.floor, "procrastinate_jobs").as_string(None)
        if owner.execute("select to_regclass(%s)", (peer,)).fetchone() != (None,):
            owner.execute(
                sql.SQL("truncate {} restart identity cascade").format(
                    sql.SQL(", ").join(sql.Identifier(world.floor, t) for t in PEER_TABLES)
                )
            )
        with owner.transaction():
            set_tenant_context(owner, world.tenant)
            owner.execute("set local keel.purge = on")
            owner.execute("delete from keel.outbox where tenant_id = %s", (world.tenant,))
            owner.execute("delete from keel.operations where tenant_id = %s", (world.tenant,))
            owner.execute("delete from keel.task_events where tenant_id = %s", (world.tenant,))
            owner.execute("delete from keel.tasks where tenant_id = %s", (world.tenant,))
        if not vacuum:
            return
        for table in ("keel.tasks", "keel.task_events", "keel.outbox", "keel.operations"):
            owner.execute(sql.SQL("vacuum analyze {}").format(sql.SQL(table)))
        owner.execute(sql.SQL("vacuum analyze {}.jobs").format(sql.Identifier(world.floor)))


def _analyze(world: World) -> None:
    """Fresh statistics on both sides after loading, as autovacuum would soon have them."""
    with psycopg.connect(world.dsn, autocommit=True) as owner:
        owner.execute("analyze keel.tasks")
        owner.execute(sql.SQL("analyze {}.jobs").format(sql.Identifier(world.floor)))


# claim + complete ---------------------------------------------------------------------------

KEEL_CLAIM = (
    "select tenant_id, task_id, state_version, fencing_token"
    " from keel.claim_next_task(%s, '30 seconds', %s)"
)
KEEL_DONE = "select state from keel.transition_task(%s, %s, %s, 'done', p_fencing_token => %s)"
FLOOR_CLAIM = """
update {s}.jobs as j
set token = j.token + 1, lease_owner = %s, lease_expires_at = now() + interval '30 seconds',
    wake_at = now() + interval '30 seconds', updated_at = now()
where (j.tenant_id, j.id) = (
    select c.tenant_id, c.id from {s}.jobs as c
    where c.wake_at <= now() and (c.lease_expires_at is null or c.lease_expires_at <= now())
    order by c.wake_at limit 1 for update skip locked
)
returning j.tenant_id, j.id, j.version, j.token
"""
# The completion appends one history row, as keel's transition appends its event.
FLOOR_DONE = """
with done as (
    update {s}.jobs set state = 'done', version = version + 1, lease_owner = null,
        lease_expires_at = null, wake_at = null, updated_at = now()
    where tenant_id = %s and id = %s and token = %s and lease_expires_at > now()
    returning tenant_id, id, version
)
insert into {s}.events (tenant_id, job_id, seq, to_state)
select tenant_id, id, version, 'done' from done
"""


def _call(conn: psycopg.Connection, query: str, params: tuple[Any, ...]) -> Any:
    """The client's shape of a trusted call: one statement in autocommit, which takes the
    tenant it names as its context (keel.require_tenant)."""
    return conn.execute(query.encode(), params).fetchone()


def _claim_complete_op(world: World, side: Side, index: int) -> Op:
    owner = f"bench-w{index}"
    if side == "floor":
        claim = sql.SQL(FLOOR_CLAIM).format(s=sql.Identifier(world.floor))
        done = sql.SQL(FLOOR_DONE).format(s=sql.Identifier(world.floor))

        def floor_op(conn: psycopg.Connection) -> int:
            row = conn.execute(claim, (owner,)).fetchone()
            if row is None:
                return 0
            tenant, job, _, token = row
            conn.execute(done, (tenant, job, token))
            return 1

        return floor_op

    def keel_op(conn: psycopg.Connection) -> int:
        row = conn.execute(KEEL_CLAIM.encode(), (owner, world.workflow)).fetchone()
        if row is None:
            return 0
        tenant, task, version, token = row
        _call(conn, KEEL_DONE, (tenant, task, version, token))
        return 1

    return keel_op


# batch-100 claim + complete against the single-row floor --------------------------------

BATCH = 100
KEEL_CLAIM_BATCH = (
    "select tenant_id, task_id, state_version, fencing_token"
    " from keel.claim_next_tasks(%s, %s, '30 seconds', %s)"
)
KEEL_DONE_BATCH = (
    "select count(*) filter (where refused_sqlstate is null)"
    " from keel.transition_tasks(%s, %s::jsonb)"
)


def _batch_claim_complete_op(world: World, side: Side, index: int) -> Op:
    """The keel side claims and completes BATCH tasks per pair of calls; the floor is the
    single-row claim + complete, what the batch is meant to beat."""
    if side == "floor":
        return _claim_complete_op(world, side, index)
    owner = f"bench-w{index}"

    def keel_op(conn: psycopg.Connection) -> int:
        rows = conn.execute(KEEL_CLAIM_BATCH.encode(), (owner, BATCH, world.workflow)).fetchall()
        by_tenant: dict[Any, list[dict[str, Any]]] = {}
        for tenant, task, version, token in rows:
            by_tenant.setdefault(tenant, []).append(
                {
                    "task_id": str(task),
                    "expected_version": version,
                    "to_state": "done",
                    "fencing_token": token,
                }
            )
        done = 0
        for tenant, items in by_tenant.items():
            row = _call(conn, KEEL_DONE_BATCH, (tenant, json.dumps(items)))
            done += int(row[0])
        return done

    return keel_op


# transition with one event and one outbox row -----------------------------------------------

KEEL_MOVE = (
    "select state_version from keel.transition_task(%s, %s, %s, %s,"
    " p_payload => %s::jsonb, p_outbox => %s::jsonb)"
)
FLOOR_READ = "select version, state from {s}.jobs where tenant_id = %s and id = %s"
FLOOR_MOVE = (
    "update {s}.jobs set state = %s, version = version + 1, updated_at = now()"
    " where tenant_id = %s and id = %s and version = %s"
)
FLOOR_EVENT = (
    "insert into {s}.events (tenant_id, job_id, seq, to_state, payload)"
    " values (%s, %s, %s, %s, %s::jsonb)"
)
FLOOR_OUTBOX = (
    "insert into {s}.outbox (tenant_id, job_id, topic, payload) values (%s, %s, %s, %s::jsonb)"
)
PAYLOAD = '{"step": "bench"}'
OUTBOX = '[{"topic": "bench.moved", "payload": {"step": "bench"}}]'


def _own_job(index: int) -> uuid.UUID:
    """The index-th due job of a side (_load_jobs), each worker moving its own."""
    return uuid.UUID(hashlib.md5(f"bench-{index}".encode(), usedforsecurity=False).hexdigest())


def _transition_op(world: World, side: Side, index: int) -> Op:
    job = _own_job(index)
    tenant = world.tenant
    state = {"version": 1, "to": "a"}
    if side == "floor":
        s = sql.Identifier(world.floor)
        read, move = sql.SQL(FLOOR_READ).format(s=s), sql.SQL(FLOOR_MOVE).format(s=s)
        event, outbox = sql.SQL(FLOOR_EVENT).format(s=s), sql.SQL(FLOOR_OUTBOX).format(s=s)

        def floor_op(conn: psycopg.Connection) -> int:
            with conn.transaction():
                row = conn.execute(read, (tenant, job)).fetchone()
                assert row is not None
                version = row[0]
                to = "a" if row[1] != "a" else "b"
                moved = conn.execute(move, (to, tenant, job, version))
                assert moved.rowcount == 1
                conn.execute(event, (tenant, job, version + 1, to, PAYLOAD))
                conn.execute(outbox, (tenant, job, "bench.moved", PAYLOAD))
            return 1

        return floor_op

    def keel_op(conn: psycopg.Connection) -> int:
        to = state["to"]
        row = _call(conn, KEEL_MOVE, (tenant, job, state["version"], to, PAYLOAD, OUTBOX))
        state["version"] = row[0]
        state["to"] = "b" if to == "a" else "a"
        return 1

    return keel_op


# reserve: half new keys, half replays of a key reserved before ----------------------------

KEEL_RESERVE = "select outcome from keel.reserve_operation(%s, null, %s, 'bench', %s)"
FLOOR_RESERVE = """
with inserted as (
    insert into {s}.operations (tenant_id, key, input_hash) values (%s, %s, %s)
    on conflict (tenant_id, key) do nothing
    returning input_hash
)
select coalesce(
    (select 'reserved' from inserted),
    (select case when o.input_hash = %s then 'replayed' else 'conflict' end
     from {s}.operations as o where o.tenant_id = %s and o.key = %s)
)
"""


def _empty_claim_op(world: World, side: Side, index: int) -> Op:
    """A claim with nothing due, counted as one operation: what every idle worker pays per
    poll (on Citus a scan of every shard)."""
    claim = _claim_complete_op(world, side, index)

    def op(conn: psycopg.Connection) -> int:
        claim(conn)
        return 1

    return op


def _reserve_op(world: World, side: Side, index: int) -> Op:
    tenant, counter = world.tenant, [0]
    floor_query = sql.SQL(FLOOR_RESERVE).format(s=sql.Identifier(world.floor))

    def key() -> tuple[str, str]:
        """Odd calls reserve a new key; even calls replay the key of the call before."""
        counter[0] += 1
        n = counter[0]
        return f"w{index}-{n if n % 2 else n - 1}", f"hash-{index}"

    def floor_op(conn: psycopg.Connection) -> int:
        k, h = key()
        conn.execute(floor_query, (tenant, k, h, h, tenant, k)).fetchone()
        return 1

    def keel_op(conn: psycopg.Connection) -> int:
        k, h = key()
        _call(conn, KEEL_RESERVE, (tenant, k, h))
        return 1

    return floor_op if side == "floor" else keel_op


# a peer: procrastinate's own fetch + finish against keel's claim + complete -------------
# The peer's schema (procrastinate/sql/schema.sql, from the installed package: pip install
# 'agentkeel[peers]') goes into the floor's schema; its side runs there (search_path) as
# the --dsn role. procrastinate's triggers append a row to procrastinate_events as a job
# starts and as it finishes; keel appends its event on completion.

PEER = "procrastinate"
PEER_TABLES = ("procrastinate_jobs", "procrastinate_events", "procrastinate_workers")
PEER_WORKERS = 64  # registered once per run: a worker id per connection
PEER_FETCH = "select id from procrastinate_fetch_job_v2(null, %s)"
PEER_FINISH = "select procrastinate_finish_job_v1(%s, 'succeeded', false)"


def peer_available() -> bool:
    """Whether procrastinate is installed (its schema file ships in its package)."""
    import importlib.util

    return importlib.util.find_spec(PEER) is not None


def _peer_schema() -> str:
    import importlib.resources

    return (importlib.resources.files(PEER) / "sql" / "schema.sql").read_text()


def _load_peer(world: World, side: Side, rows: int) -> None:
    """keel: due tasks; the peer: its schema (once), then rows jobs to do and its workers."""
    if side == "keel":
        _load_jobs(world, side, rows)
        return
    with psycopg.connect(peer_dsn(world), autocommit=True) as conn:
        _install_peer(conn)
        conn.execute(
            "insert into procrastinate_workers select from generate_series(1, %s)",
            (PEER_WORKERS,),
        )
        conn.execute(
            "insert into procrastinate_jobs (queue_name, task_name, args)"
            " select 'default', 'bench', '{}' from generate_series(1, %s)",
            (rows,),
        )
        conn.execute("analyze procrastinate_jobs")


def _install_peer(conn: psycopg.Connection) -> None:
    """The peer's schema, once per bench, on the connection's search_path (peer_dsn)."""
    if conn.execute("select to_regclass('procrastinate_jobs')").fetchone() == (None,):
        conn.execute(_peer_schema().encode())


def _load_finished(world: World, workload: str, side: Side, rows: int) -> None:
    """rows finished tasks or jobs on the side, off its claim path: the peer's own jobs,
    succeeded, on a peer's floor side."""
    if not (side == "floor" and workload.startswith("peer-")):
        _load_jobs(world, side, rows, state="done")
        return
    with psycopg.connect(peer_dsn(world), autocommit=True) as conn:
        _install_peer(conn)
        conn.execute(
            "insert into procrastinate_jobs (queue_name, task_name, args, status)"
            " select 'default', 'bench', '{}', 'succeeded' from generate_series(1, %s)",
            (rows,),
        )


def _peer_op(world: World, side: Side, index: int) -> Op:
    if side == "keel":
        return _claim_complete_op(world, side, index)
    worker = index % PEER_WORKERS + 1

    def peer_op(conn: psycopg.Connection) -> int:
        row = conn.execute(PEER_FETCH, (worker,)).fetchone()
        if row is None or row[0] is None:
            return 0
        conn.execute(PEER_FINISH, (row[0],))
        return 1

    return peer_op


def peer_dsn(world: World) -> str:
    """The --dsn role with the floor's schema, where the peer's schema lives, on its path."""
    schema = sql.Identifier(world.floor).as_string(None)
    return conninfo.make_conninfo(world.dsn, options=f"-c search_path={schema}")


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            "claim-complete",
            "claim the oldest due task of any tenant, then a fenced completion",
            lambda world, side, rows: _load_jobs(world, side, rows),
            _claim_complete_op,
        ),
        Workload(
            "batch-claim-complete",
            "claim 100 due tasks and complete them in two calls, against the single-row floor",
            lambda world, side, rows: _load_jobs(world, side, rows * (4 if side == "keel" else 1)),
            _batch_claim_complete_op,
        ),
        Workload(
            "transition",
            "a version-checked transition writing one event and one outbox row",
            # a job per worker (--workers is at most 256), each moved by its own worker
            lambda world, side, rows: _load_jobs(world, side, 256),
            _transition_op,
        ),
        Workload(
            "reserve",
            "reserve an idempotency key: half new keys, half replays with the same input",
            lambda world, side, rows: None,
            _reserve_op,
        ),
        Workload(
            "peer-procrastinate",
            "keel's claim + complete against procrastinate's fetch + finish (on the floor side)",
            _load_peer,
            _peer_op,
            default=False,
        ),
        Workload(
            "empty-claim",
            "a claim when nothing is due (an idle worker's poll)",
            lambda world, side, rows: None,
            _empty_claim_op,
            default=False,
        ),
    )
}


WORKLOAD_NAMES = tuple(WORKLOADS)
# The peer comparison is in the default set when the peer is installed.
DEFAULT_WORKLOADS = tuple(
    w.name
    for w in WORKLOADS.values()
    if w.default or (w.name == f"peer-{PEER}" and peer_available())
)


# -- running ----------------------------------------------------------------------------------


def connection_dsn(world: World, workload: str, side: Side) -> str:
    if side == "floor":
        return peer_dsn(world) if workload.startswith("peer-") else world.dsn
    claims = "claim" in workload or workload.startswith("peer-")
    return world.worker_dsn if claims else world.app_dsn


STORAGE = """
select
    coalesce(sum(pg_table_size(c.oid)), 0)::bigint,
    coalesce(sum(pg_indexes_size(c.oid)), 0)::bigint,
    coalesce(sum(s.n_dead_tup), 0)::bigint
from unnest(%s::regclass[]) as c (oid)
left join pg_stat_user_tables as s on s.relid = c.oid
"""


def side_tables(world: World, side: Side, workload: str = "") -> list[str]:
    """The tables a side writes, as regclass text (the peer's own on a peer's floor side)."""
    if side == "keel":
        return ["keel.tasks", "keel.task_events", "keel.outbox", "keel.operations"]
    floor = sql.Identifier(world.floor).as_string(None)
    if workload.startswith("peer-"):
        return [f"{floor}.{table}" for table in PEER_TABLES]
    return [f"{floor}.{table}" for table in ("jobs", "events", "outbox", "operations")]


FUNCTIONS = """
select f.funcid::regprocedure::text, f.calls, f.total_time, f.self_time
from pg_stat_user_functions as f
where f.schemaname = 'keel'
"""


def _statements_loaded(conn: psycopg.Connection) -> bool:
    row = conn.execute("select current_setting('shared_preload_libraries')").fetchone()
    return bool(row and "pg_stat_statements" in str(row[0]))


STATEMENTS = """
select s.query, sum(s.calls)::bigint, sum(s.total_exec_time)
from pg_stat_statements as s
join pg_roles as r on r.oid = s.userid
where r.rolname = any(%s) and not s.toplevel
    and s.dbid = (select d.oid from pg_database as d where d.datname = current_database())
group by s.query
"""


def statement_stats(world: World) -> dict[str, tuple[int, float]]:
    """The statements the keel logins' calls ran inside functions so far (not the calls
    themselves: their time is the run's): (calls, total ms) per query text."""
    if not world.statements:
        return {}
    with psycopg.connect(world.dsn, autocommit=True) as conn:
        # Inside a SECURITY DEFINER function a statement runs as keel_owner.
        rows = conn.execute(STATEMENTS, ([*world.logins, "keel_owner"],)).fetchall()
    return {str(q): (int(c), float(t)) for q, c, t in rows}


def statements_during(
    world: World, before: dict[str, tuple[int, float]], top: int = 12
) -> list[tuple[str, int, float]]:
    """The dearest statements the keel logins ran since before: (query, calls, total ms)."""
    if not world.statements:
        return []
    during = []
    for query, (calls, total) in statement_stats(world).items():
        c0, t0 = before.get(query, (0, 0.0))
        if calls > c0:
            during.append((query, calls - c0, total - t0))
    return sorted(during, key=lambda s: -s[2])[:top]


def function_stats(world: World) -> dict[str, tuple[int, float, float]]:
    """Every keel function's (calls, total ms, self ms) so far, as the server counts them
    (track_functions, which bench_world sets on its logins when it may)."""
    with psycopg.connect(world.dsn, autocommit=True) as conn:
        rows = conn.execute(FUNCTIONS).fetchall()
    return {str(name): (int(calls), float(total), float(own)) for name, calls, total, own in rows}


def functions_during(
    world: World, before: dict[str, tuple[int, float, float]]
) -> dict[str, tuple[int, float, float]]:
    """The calls made during the run: the counts after it less those before. A backend
    reports its counts as it exits, just after pgbench has returned; read until two reads
    a tenth of a second apart agree (at most two seconds)."""
    after = function_stats(world)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        time.sleep(0.1)
        again = function_stats(world)
        if again == after:
            break
        after = again
    delta = {}
    for name, (calls, total, own) in after.items():
        c0, t0, s0 = before.get(name, (0, 0.0, 0.0))
        if calls > c0:
            delta[name] = (calls - c0, total - t0, own - s0)
    return delta


def run_side(
    world: World,
    workload: Workload,
    side: Side,
    workers: int,
    duration: float,
    progress: Callable[[float], None] | None = None,
) -> Run:
    """Run one side with `workers` threads for `duration` seconds, sampling the size and
    dead tuples of the side's tables once per slice."""
    dsn = connection_dsn(world, workload.name, side)
    monitor = psycopg.connect(world.dsn, autocommit=True)
    tables = side_tables(world, side, workload.name)
    storage: list[tuple[float, int, int, int]] = []

    def sample(elapsed: float) -> None:
        row = monitor.execute(STORAGE, (tables,)).fetchone()
        assert row is not None
        storage.append((elapsed, int(row[0]), int(row[1]), int(row[2])))

    functions_before = function_stats(world) if side == "keel" else {}
    statements_before = statement_stats(world) if side == "keel" else {}
    conns = [psycopg.connect(dsn, autocommit=True) for _ in range(workers)]
    ops = [workload.op(world, side, i) for i in range(workers)]
    done: list[list[tuple[float, float, int]]] = [[] for _ in range(workers)]
    failures: list[BaseException] = []
    start = threading.Barrier(workers + 1)
    began = [0.0]

    def work(i: int) -> None:
        conn, op, mine = conns[i], ops[i], done[i]
        start.wait()
        deadline = began[0] + duration
        try:
            while (now := time.perf_counter()) < deadline:
                n = op(conn)
                end = time.perf_counter()
                if n == 0:
                    time.sleep(0.001)  # nothing due: the run has drained its rows
                    continue
                mine.append((end, (end - now) * 1000, n))
        except BaseException as err:  # reported after the run, with every thread joined
            failures.append(err)

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(workers)]
    for t in threads:
        t.start()
    sample(0.0)
    began[0] = time.perf_counter()
    start.wait()
    next_sample = SLICE_S
    while any(t.is_alive() for t in threads):
        time.sleep(0.2)
        elapsed = min(duration, time.perf_counter() - began[0])
        if elapsed >= next_sample:
            sample(elapsed)
            next_sample += SLICE_S
        if progress is not None:
            progress(elapsed)
    for t in threads:
        t.join()
    for conn in conns:
        conn.close()
    sample(duration)
    monitor.close()
    if failures:
        raise failures[0]
    events = sorted(e for mine in done for e in mine)
    slices = [0] * max(1, int(duration / SLICE_S + 0.999))
    for end, _, n in events:
        slices[min(len(slices) - 1, int((end - began[0]) / SLICE_S))] += n
    return Run(
        workload.name,
        side,
        workers,
        duration,
        sum(n for _, _, n in events),
        [latency for _, latency, _ in events],
        slices,
        storage,
        functions=functions_during(world, functions_before) if side == "keel" else {},
        statements=statements_during(world, statements_before) if side == "keel" else [],
    )


def rows_for(duration: float, workers: int) -> int:
    """Rows a run may consume: more than this machine kind completes in the time (a run
    that used them all is flagged: Run.exhausted)."""
    return int(max(5_000, 1_500 * workers * duration, 6_000 * duration))


def side_rows(world: World, workload: str, side: Side, state: str) -> int:
    """The side's jobs (tasks) in state queued or done: a claim run's rows left, or done."""
    with psycopg.connect(world.dsn, autocommit=True) as conn:
        if side == "floor":
            table, column, value = (
                ("procrastinate_jobs", "status", {"queued": "todo", "done": "succeeded"}[state])
                if workload.startswith("peer-")
                else ("jobs", "state", state)
            )
            query = sql.SQL("select count(*) from {}.{} where {} = %s").format(
                sql.Identifier(world.floor), sql.Identifier(table), sql.Identifier(column)
            )
            row = conn.execute(query, (value,)).fetchone()
        else:
            with conn.transaction():
                set_tenant_context(conn, world.tenant)
                row = conn.execute(
                    "select count(*) from keel.tasks where tenant_id = %s and state = %s",
                    (world.tenant, state),
                ).fetchone()
    assert row is not None
    return int(row[0])


def run(
    dsn: str,
    workloads: list[str],
    workers: list[int],
    duration: float,
    repeats: int,
    progress: Callable[[str, int, float], None] | None = None,
    finished_rows: int = 0,
    vacuum: bool = True,
    pgbench: Path | None = None,
) -> list[Run]:
    """Every workload at every worker count, `repeats` times each side, alternating.
    finished_rows: finished tasks (jobs) loaded before each run; vacuum=False leaves the
    tables as the previous run left them (sustained runs); pgbench: drive the runs with
    that pgbench (agentkeel.bench_pgbench) instead of Python threads."""
    runs: list[Run] = []
    run_one: Callable[..., Run] = run_side
    if pgbench is not None:
        from agentkeel.bench_pgbench import run_side_pgbench

        run_one = functools.partial(run_side_pgbench, pgbench=pgbench)

    with bench_world(dsn) as world:
        for name in workloads:
            workload = WORKLOADS[name]
            for n in workers:
                for repeat in range(repeats):
                    order = ("floor", "keel") if repeat % 2 == 0 else ("keel", "floor")
                    for side in order:
                        _clear(world, vacuum)
                        if finished_rows:
                            _load_finished(world, name, side, finished_rows)
                        workload.load(world, side, rows_for(duration, n))
                        _analyze(world)
                        label = f"{name} x{n} {side} {repeat + 1}/{repeats}"

                        def tick(
                            elapsed: float, label: str = label, index: int = len(runs)
                        ) -> None:
                            if progress is not None:
                                progress(label, index, elapsed)

                        done = run_one(world, workload, side, n, duration, tick)
                        claims = "claim" in name or name.startswith("peer-")
                        if claims and name != "empty-claim":
                            done.exhausted = side_rows(world, name, side, "queued") == 0
                        runs.append(done)
        _clear(world, vacuum=False)
    return runs
