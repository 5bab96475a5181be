"""`agentkeel bench --workload noisy`: what one tenant's load costs another tenant's claims.

Two cases, each with tenant A making noise and tenant B waiting:
- a worker's task claim while an open transaction of A holds row locks on N of A's due
  tasks, older than B's (every claim must step over them: SKIP LOCKED tries each lock);
- a relay's outbox claim of 100 after A committed N due messages and then B one: how many
  claims until B's message comes, and what a claim costs with A's messages due.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
from psycopg import conninfo, sql

from agentkeel.bench import _remove_tenant
from agentkeel.client import set_tenant_context

LOCKED_ROWS = (0, 1_000, 10_000, 100_000)
DUE_MESSAGES = (0, 10_000, 100_000)
CLAIMS = 20  # task claims timed per case
OUTBOX_BATCH = 100


@dataclass(frozen=True)
class NoisyMeasurement:
    case: str
    noise: int  # A's locked tasks, or A's due messages
    p50_ms: float
    max_ms: float
    claims_until_served: int  # claims until B got what it waited for (1: the next one)


@dataclass(frozen=True)
class _Place:
    dsn: str
    worker_dsn: str
    relay_dsn: str
    workflow: str
    tag: str


@contextmanager
def _place(dsn: str) -> Iterator[_Place]:
    """A worker and a relay login and a workflow of the bench's own; removed afterwards."""
    tag = uuid.uuid4().hex[:8]
    worker, relay, workflow = f"bench_noisy_w_{tag}", f"bench_noisy_r_{tag}", f"bench-noisy-{tag}"
    with psycopg.connect(dsn, autocommit=True) as owner:
        for role, group in ((worker, "keel_worker"), (relay, "keel_relay")):
            owner.execute(
                sql.SQL("create role {} login in role {}").format(
                    sql.Identifier(role), sql.Identifier(group)
                )
            )
        owner.execute(
            "select keel.define_workflow(%s, 1, 'queued', %s::jsonb)",
            (workflow, '[["queued", "done"]]'),
        )
    try:
        yield _Place(
            dsn,
            conninfo.make_conninfo(dsn, user=worker),
            conninfo.make_conninfo(dsn, user=relay),
            workflow,
            tag,
        )
    finally:
        with psycopg.connect(dsn, autocommit=True) as owner:
            owner.execute("delete from keel.workflows where workflow = %s", (workflow,))
            for role in (worker, relay):
                owner.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(role)))


@contextmanager
def _tenants(dsn: str) -> Iterator[tuple[uuid.UUID, uuid.UUID]]:
    """Tenants A and B, with everything they wrote removed afterwards."""
    made = (uuid.uuid4(), uuid.uuid4())
    with psycopg.connect(dsn, autocommit=True) as owner:
        for tenant in made:
            with owner.transaction():
                set_tenant_context(owner, tenant)
                owner.execute("select keel.create_tenant(%s, 'agentkeel-bench-noisy')", (tenant,))
    try:
        yield made
    finally:
        with psycopg.connect(dsn, autocommit=True) as owner:
            for tenant in made:
                _remove_tenant(owner, tenant)


def _due_tasks(
    owner: psycopg.Connection, tenant: uuid.UUID, workflow: str, n: int, age: str
) -> None:
    with owner.transaction():
        set_tenant_context(owner, tenant)
        owner.execute(
            "insert into keel.tasks (tenant_id, workflow, workflow_version, state, wake_at)"
            " select %s, %s, 1, 'queued', now() - %s::interval from generate_series(1, %s)",
            (tenant, workflow, age, n),
        )


def _task_claims(place: _Place, locked: int) -> NoisyMeasurement:
    """B's worker claims one task at a time, CLAIMS times, while A's transaction holds
    locks on `locked` of A's due tasks, all older than B's."""
    with _tenants(place.dsn) as (a, b), psycopg.connect(place.dsn, autocommit=True) as owner:
        _due_tasks(owner, a, place.workflow, locked, "1 hour")
        _due_tasks(owner, b, place.workflow, CLAIMS, "1 minute")
        owner.execute("vacuum (analyze) keel.tasks")
        with psycopg.connect(place.dsn) as holder, psycopg.connect(place.worker_dsn) as worker:
            worker.autocommit = True
            set_tenant_context(holder, a)
            held = holder.execute(
                "select count(*) from (select 1 from keel.tasks where tenant_id = %s"
                " and workflow = %s for update) as l",
                (a, place.workflow),
            ).fetchone()
            assert held is not None and held[0] == locked
            times = []
            for _ in range(CLAIMS):
                started = time.perf_counter()
                row = worker.execute(
                    "select tenant_id from keel.claim_next_task('bench-noisy', '1 hour', %s)",
                    (place.workflow,),
                ).fetchone()
                times.append(time.perf_counter() - started)
                if row is None or row[0] != b:
                    raise RuntimeError(f"the bench's claim returned {row}, not a task of B")
            holder.rollback()
    return NoisyMeasurement(
        "task claim, A's transaction locking its due tasks",
        locked,
        statistics.median(times) * 1000,
        max(times) * 1000,
        1,
    )


def _messages(owner: psycopg.Connection, tenant: uuid.UUID, topic: str, n: int) -> None:
    with owner.transaction():
        set_tenant_context(owner, tenant)
        owner.execute(
            "insert into keel.outbox (tenant_id, topic, payload)"
            " select %s, %s, jsonb_build_object('n', g) from generate_series(1, %s) as g",
            (tenant, topic, n),
        )


def _outbox_claims(place: _Place, due: int) -> NoisyMeasurement:
    """A commits `due` messages, then B one; a relay claims batches of OUTBOX_BATCH until
    B's message has come and CLAIMS claims are timed (or nothing is left)."""
    prefix = f"bench-noisy-{place.tag}-{due}."
    claim = "select tenant_id from keel.claim_outbox('bench-noisy', %s, '1 hour', %s)"
    with _tenants(place.dsn) as (a, b), psycopg.connect(place.dsn, autocommit=True) as owner:
        _messages(owner, a, f"{prefix}a", due)
        _messages(owner, b, f"{prefix}b", 1)
        owner.execute("vacuum (analyze) keel.outbox")
        times: list[float] = []
        claims = served = 0
        with psycopg.connect(place.relay_dsn, autocommit=True) as relay:
            relay.execute(claim, (1, f"{prefix}none"))  # the session's plans, made once
            while not served or len(times) < CLAIMS:
                started = time.perf_counter()
                tenants = {r[0] for r in relay.execute(claim, (OUTBOX_BATCH, prefix))}
                elapsed = time.perf_counter() - started
                if not tenants:
                    break
                claims += 1
                if len(times) < CLAIMS:
                    times.append(elapsed)
                if b in tenants and not served:
                    served = claims
        if not served:
            raise RuntimeError("the bench's claims ended without B's message")
    return NoisyMeasurement(
        f"outbox claim of {OUTBOX_BATCH}, A's messages due before B's",
        due,
        statistics.median(times) * 1000,
        max(times) * 1000,
        served,
    )


def run_noisy_bench(
    dsn: str, locked: tuple[int, ...] = LOCKED_ROWS, due: tuple[int, ...] = DUE_MESSAGES
) -> list[NoisyMeasurement]:
    """Each case at each size, in a workflow, tenants and logins of the bench's own."""
    with _place(dsn) as place:
        return [_task_claims(place, n) for n in locked] + [_outbox_claims(place, n) for n in due]
