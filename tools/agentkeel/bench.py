"""`agentkeel bench`: what the tenant policy costs per statement and per row.

Two tenants with N tasks each; count(*) of one tenant's tasks as a trusted app login
(plain context), through the primary-key index and with a forced sequential scan, against
the same count without row-level security; and an agent login (signed token, sent as a
bind parameter), which has no table access, reading pages through keel.list_tasks.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import psycopg
from psycopg import conninfo, sql

from agentkeel.client import Keel, set_tenant_context

# One statement each: agentkeel never sends a multi-statement query string (on Citus the
# whole text of a query holding a SET LOCAL is sent on to the workers).
SEQ_SCAN = (
    "set local enable_indexscan = off",
    "set local enable_bitmapscan = off",
    "set local enable_indexonlyscan = off",
)


@dataclass(frozen=True)
class Measurement:
    case: str
    best_ms: float
    rows_scanned: int

    @property
    def us_per_row(self) -> float:
        return self.best_ms * 1000 / self.rows_scanned


Setup = tuple[tuple[str, tuple[object, ...]], ...]


def _best(dsn: str, setup: Setup, query: str, repeats: int) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        best = float("inf")
        for _ in range(repeats):
            with conn.transaction():
                for statement, params in setup:
                    conn.execute(statement.encode(), params or None)
                started = time.perf_counter()
                conn.execute(query.encode()).fetchall()
                best = min(best, time.perf_counter() - started)
    return best * 1000


def _remove_tenant(owner: psycopg.Connection, tenant: uuid.UUID) -> None:
    """The bench's own cleanup, as the owner: its tenant and, by cascade, its rows (events
    through a purge). Not client API: every product write goes through a guarded function."""
    with owner.transaction():
        set_tenant_context(owner, tenant)
        owner.execute("set local keel.purge = on")
        owner.execute("delete from keel.tenants where tenant_id = %s", (tenant,))


def run(dsn: str, rows: int = 50_000, repeats: int = 3) -> list[Measurement]:
    """Measure on dsn (needs a superuser or CREATEROLE owner); removes what it made."""
    suffix = uuid.uuid4().hex[:8]
    app, agent, workflow = f"bench_app_{suffix}", f"bench_agent_{suffix}", f"bench-{suffix}"
    a, b = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(dsn, autocommit=True) as owner:
        keel = Keel(owner)
        keel.define_workflow(workflow, 1, "queued", [("queued", "done")])
        for tenant in (a, b):
            keel.create_tenant("agentkeel-bench", tenant)
            with keel.transaction(tenant) as tx:
                tx.execute(
                    "insert into keel.tasks (tenant_id, workflow, workflow_version, state)"
                    " select %s, %s, 1, 'queued' from generate_series(1, %s)",
                    (tenant, workflow, rows),
                )
        owner.execute("analyze keel.tasks")
        token = keel.mint_tenant_token(a)
    try:
        with psycopg.connect(dsn, autocommit=True) as owner:
            for role, group in ((app, "keel_app"), (agent, "keel_agent")):
                owner.execute(
                    sql.SQL("create role {} login in role {}").format(
                        sql.Identifier(role), sql.Identifier(group)
                    )
                )
        as_app = conninfo.make_conninfo(dsn, user=app)
        as_agent = conninfo.make_conninfo(dsn, user=agent)
        plain: Setup = (("select keel.use_tenant(%s)", (a,)),)
        signed: Setup = (
            (
                "select set_config('keel.tenant_token', %s, true), keel.bind_tenant_context()",
                (token,),
            ),
        )
        seq_scan: Setup = tuple((statement, ()) for statement in SEQ_SCAN)
        count = "select count(*) from keel.tasks"
        page = min(rows, 1000)
        cases: list[tuple[str, str, Setup, str, int]] = [
            (
                "no RLS (owner, explicit tenant_id), sequential scan",
                dsn,
                seq_scan,
                f"{count} where tenant_id = '{a}'",
                2 * rows,
            ),
            ("app, plain context, primary-key index", as_app, plain, count, 2 * rows),
            ("app, plain context, sequential scan", as_app, plain + seq_scan, count, 2 * rows),
            (
                "agent, signed token, keel.list_tasks page",
                as_agent,
                signed,
                f"select count(*) from keel.list_tasks('{a}', p_limit => {page})",
                page,
            ),
        ]
        return [
            Measurement(case, _best(target, setup, query, repeats), scanned)
            for case, target, setup, query, scanned in cases
        ]
    finally:
        with psycopg.connect(dsn, autocommit=True) as owner:
            for tenant in (a, b):
                _remove_tenant(owner, tenant)
            owner.execute("delete from keel.workflows where workflow = %s", (workflow,))
            for role in (app, agent):
                owner.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(role)))


# -- the relay ---------------------------------------------------------------------


@dataclass(frozen=True)
class RelayMeasurement:
    sink: str
    batch: int
    messages: int
    seconds: float | None  # None: skipped
    note: str = ""
    backlog: int = 0  # messages of another tenant held behind in-flight keys meanwhile

    @property
    def per_second(self) -> float | None:
        return None if not self.seconds else self.messages / self.seconds


async def _stream(nats_url: str, name: str, prefix: str, create: bool) -> None:
    import nats

    nc = await nats.connect(nats_url, connect_timeout=5, max_reconnect_attempts=0)
    try:
        js = nc.jetstream(timeout=10)
        if create:
            await js.add_stream(name=name, subjects=[f"{prefix}.>"], duplicate_window=600.0)
        else:
            await js.delete_stream(name)
    finally:
        await nc.close()


def _enqueue(dsn: str, tenant: uuid.UUID, topic: str, messages: int) -> None:
    """The bench's own fixture, as the owner: pending messages written directly (the
    relay's cost is measured, not transition_task's)."""
    with psycopg.connect(dsn, autocommit=True) as owner, owner.transaction():
        set_tenant_context(owner, tenant)
        owner.execute(
            "insert into keel.outbox (tenant_id, topic, payload)"
            " select %s, %s, jsonb_build_object('n', g, 'text', repeat('x', 200))"
            " from generate_series(1, %s) as g",
            (tenant, topic, messages),
        )


BACKLOG_KEYS = 5
BACKLOG_PER_TRANSITION = 1000


def _hold_backlog(dsn: str, tenant: uuid.UUID, workflow: str, topic: str, messages: int) -> None:
    """The backlog fixture: ``messages`` pending messages of another tenant on five keys,
    written as an application writes them (keel.transition_task, a thousand a transition),
    older than everything the bench delivers, whose first messages are in flight (claimed
    for an hour by a relay that never reports back), so the rest wait behind them."""
    with psycopg.connect(dsn, autocommit=True) as owner:
        keel = Keel(owner)
        for start in range(0, messages, BACKLOG_PER_TRANSITION):
            count = min(BACKLOG_PER_TRANSITION, messages - start)
            task = keel.create_task(tenant, workflow, 1)
            keel.transition_task(
                tenant,
                task.task_id,
                1,
                "done",
                outbox=[
                    {"topic": topic, "key": f"key-{n % BACKLOG_KEYS}", "payload": {"n": n}}
                    for n in range(start, start + count)
                ],
            )
        owner.execute(
            "select count(*) from keel.claim_outbox('agentkeel-bench-backlog', %s, '1 hour', %s)",
            (BACKLOG_KEYS, topic),
        )
        # Settled before the clock starts: no autovacuum of the new rows mid-measurement.
        owner.execute("vacuum (analyze) keel.outbox")


def _drain(dsn: str, sink_url: str, batch: int, prefix: str) -> float:
    import asyncio

    from agentkeel.relay import Config, parse_sink
    from agentkeel.relay import run as run_relay

    config = Config(
        dsn=dsn,
        batch=batch,
        once=True,
        listen=False,
        topic_prefix=prefix,
        handle_signals=False,
        name="agentkeel-bench",
    )
    started = time.perf_counter()
    stats = asyncio.run(run_relay(config, parse_sink(sink_url)))
    elapsed = time.perf_counter() - started
    if stats.retried or stats.dead:
        raise RuntimeError(f"the relay failed to deliver during the bench: {stats.as_dict()}")
    return elapsed


def run_relay_bench(
    dsn: str,
    messages: int = 1000,
    batches: tuple[int, ...] = (1, 100),
    nats_url: str = "nats://127.0.0.1:4222",
    backlog: int = 0,
) -> list[RelayMeasurement]:
    """Relay throughput (messages claimed, published and acked per second) to a file and to
    NATS JetStream, at each batch size; removes what it made. NATS rows are skipped, with
    the reason, when nothing answers at nats_url. With ``backlog``, the file cases run again
    with that many messages of another tenant held behind in-flight keys."""
    import asyncio
    import logging
    import tempfile
    from pathlib import Path

    logging.getLogger("agentkeel.relay").setLevel(logging.WARNING)
    suffix = uuid.uuid4().hex[:8]
    prefix, stream = f"akbench-{suffix}", f"AKBENCH_{suffix}"
    tenant, held = uuid.uuid4(), uuid.uuid4()
    workflow = f"agentkeel-bench-{suffix}"
    with psycopg.connect(dsn, autocommit=True) as owner:
        Keel(owner).create_tenant("agentkeel-bench", tenant)
        Keel(owner).create_tenant("agentkeel-bench-backlog", held)
        if backlog:
            Keel(owner).define_workflow(workflow, 1, "queued", [("queued", "done")])
    results: list[RelayMeasurement] = []
    try:
        with tempfile.TemporaryDirectory(prefix="agentkeel-bench-") as folder:
            for held_back in (0, backlog) if backlog else (0,):
                if held_back:
                    _hold_backlog(dsn, held, workflow, f"{prefix}-held", held_back)
                for batch in batches:
                    topic = f"{prefix}.file{batch}-{held_back}"
                    _enqueue(dsn, tenant, topic, messages)
                    sink = f"file:{Path(folder) / 'relay.jsonl'}"
                    seconds = _drain(dsn, sink, batch, topic)
                    results.append(
                        RelayMeasurement(
                            "file (fsync per batch)", batch, messages, seconds, backlog=held_back
                        )
                    )
            if backlog:  # the NATS cases run without it
                with psycopg.connect(dsn, autocommit=True) as owner:
                    _remove_tenant(owner, held)
        try:
            asyncio.run(_stream(nats_url, stream, prefix, create=True))
        except Exception as error:
            note = f"skipped: no JetStream at {nats_url} ({type(error).__name__})"
            results += [
                RelayMeasurement("NATS JetStream", b, messages, None, note) for b in batches
            ]
            return results
        try:
            for batch in batches:
                topic = f"nats{batch}"
                _enqueue(dsn, tenant, f"{prefix}.{topic}", messages)
                seconds = _drain(dsn, f"{nats_url}/{prefix}", batch, f"{prefix}.{topic}")
                results.append(RelayMeasurement("NATS JetStream", batch, messages, seconds))
        finally:
            asyncio.run(_stream(nats_url, stream, prefix, create=False))
        return results
    finally:
        with psycopg.connect(dsn, autocommit=True) as owner:
            _remove_tenant(owner, tenant)
            _remove_tenant(owner, held)
            owner.execute("delete from keel.workflows where workflow = %s", (workflow,))


# -- the payload check ---------------------------------------------------------------

# Shapes of about 64 KiB (the default limit of an event payload), built in the database:
# (name, SQL expression of the jsonb value).
PAYLOAD_SHAPES: tuple[tuple[str, str], ...] = (
    (
        "3,700 distinct ASCII keys",
        "(select jsonb_object_agg('key_' || i, i) from generate_series(1, 3700) as i)",
    ),
    (
        "1,700 small objects in an array",
        "(select jsonb_agg(jsonb_build_object('id', i, 'kind', 'x', 'ok', true))"
        " from generate_series(1, 1700) as i)",
    ),
    (
        "60 keys of 1,000 characters",
        "(select jsonb_object_agg(repeat('k', 1000) || i, i) from generate_series(1, 60) as i)",
    ),
    (
        "10,000 numbers",
        "(select jsonb_build_object('n', jsonb_agg(i)) from generate_series(1, 10000) as i)",
    ),
    (
        "objects nested 63 deep",
        "(select ('{\"a\":' || repeat('{\"b\":\"' || repeat('x', 900) || '\",\"c\":', 63)"
        " || '1' || repeat('}', 63) || '}')::jsonb)",
    ),
    (
        "3,000 distinct Cyrillic keys",
        "(select jsonb_object_agg('ключ' || i, i) from generate_series(1, 3000) as i)",
    ),
    # keys that no short list of keel.fold_keys covers (the whole confusables map); the last
    # two: each key six confusables of 52 from 45 blocks, and a confusable in long ASCII keys
    (
        "2,500 distinct Armenian keys",
        "(select jsonb_object_agg('գաղտնի' || i, i) from generate_series(1, 2500) as i)",
    ),
    (
        "2,200 distinct Cherokee keys",
        "(select jsonb_object_agg('ᎠᏴᏒᎢᎾ' || i, i) from generate_series(1, 2200) as i)",
    ),
    (
        "2,700 distinct Cyrillic and Greek keys",
        "(select jsonb_object_agg('ключλ' || i, i) from generate_series(1, 2700) as i)",
    ),
    (
        "2,000 keys mixing confusables of many blocks",
        "(select jsonb_object_agg(k.key || k.i, k.i) from ("
        " select i, string_agg(substr("
        "'ƄΑЅԱ۱०০੦૦ଠ௦౦೦ഠ๐໐ဝყሀᎠᐯᚷᛁᴄ℮∣⍳│╳ⱭⲄⴸ〇ꓐꙄꛟꜱꞫꬲꭰ𐊂𐋏𐌁𐐄𐒴𐔓𑓐𑜆𑢠𖼈𝈆🝌',"  # noqa: RUF001
        " 1 + mod(i * 7 + j * 11, 52), 1), '' order by j) as key"
        " from generate_series(1, 2000) as i, generate_series(1, 6) as j group by i) as k)",
    ),
    (
        "60 keys of a confusable and 1,000 ASCII characters",
        "(select jsonb_object_agg('ա' || repeat('k', 1000) || i, i)"  # noqa: RUF001
        " from generate_series(1, 60) as i)",
    ),
)


@dataclass(frozen=True)
class PayloadMeasurement:
    shape: str
    bytes: int
    best_ms: float


def run_payload_bench(dsn: str, repeats: int = 5) -> list[PayloadMeasurement]:
    """keel.check_payload on payloads of about 64 KiB of each shape, best of `repeats`,
    timed around one statement whose payload is already in the server (a temporary
    table): the check's cost, not the transfer's. Writes nothing that outlives it."""
    results = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("create temporary table agentkeel_bench_payloads (shape text, v jsonb)")
        for shape, expression in PAYLOAD_SHAPES:
            conn.execute(
                sql.SQL("insert into agentkeel_bench_payloads select %s, {}").format(
                    sql.SQL(expression)
                ),
                (shape,),
            )
        for shape, _ in PAYLOAD_SHAPES:
            row = conn.execute(
                "select octet_length(v::text) from agentkeel_bench_payloads where shape = %s",
                (shape,),
            ).fetchone()
            assert row is not None
            best = float("inf")
            for _ in range(repeats):
                started = time.perf_counter()
                conn.execute(
                    "select keel.check_payload('bench', v, 'max_event_payload_bytes')"
                    " from agentkeel_bench_payloads where shape = %s",
                    (shape,),
                )
                best = min(best, time.perf_counter() - started)
            results.append(PayloadMeasurement(shape, int(row[0]), best * 1000))
    return results
