"""`agentkeel bench --driver pgbench`: the workloads driven by pgbench, a C client with
prepared statements, so that the figures are the server's and not the Python client's.

Each workload's two sides are pgbench scripts doing what the Python driver's do
(agentkeel.workloads): the same calls on the keel side, as the same temporary logins, and
the same writes on the floor. Runs alternate as the Python driver's do, on tables loaded
and vacuumed alike; pgbench's per-transaction log gives the latencies and the throughput
per second, and for the claims the rows moved to done give the operations.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
from psycopg import conninfo, sql

from agentkeel.exitcodes import AgentkeelError, ExitCode
from agentkeel.workloads import (
    BATCH,
    OUTBOX,
    PAYLOAD,
    SLICE_S,
    STORAGE,
    Run,
    Side,
    Workload,
    World,
    connection_dsn,
    function_stats,
    functions_during,
    side_rows,
    side_tables,
    statement_stats,
    statements_during,
)

# A claim, whether or not it found a task, is one row (got = 0 or 1): \gset needs one, and
# \if then skips the completion when there was nothing to complete.
KEEL_CLAIM_COMPLETE = """
select c.tenant_id as t, c.task_id as k, c.state_version as v, c.fencing_token as f,
    (c.task_id is not null)::int as got
from (select 1) as one
left join keel.claim_next_task('bench-w' || (:client_id)::int, '30 seconds', '{workflow}') as c
    on true
\\gset
\\if :got
select state from keel.transition_task(:t, :k, :v, 'done', p_fencing_token => :f);
\\endif
"""

# The floor's completion appends one history row, as keel's transition appends its event.
FLOOR_CLAIM_COMPLETE = """
with c as (
    update {floor}.jobs as j
    set token = j.token + 1, lease_owner = 'bench-w' || (:client_id)::int,
        lease_expires_at = now() + interval '30 seconds',
        wake_at = now() + interval '30 seconds', updated_at = now()
    where (j.tenant_id, j.id) = (
        select c.tenant_id, c.id from {floor}.jobs as c
        where c.wake_at <= now() and (c.lease_expires_at is null or c.lease_expires_at <= now())
        order by c.wake_at limit 1 for update skip locked
    )
    returning j.tenant_id, j.id, j.version, j.token
)
select c.tenant_id as t, c.id as k, c.version as v, c.token as f, (c.id is not null)::int as got
from (select 1) as one left join c on true
\\gset
\\if :got
with done as (
    update {floor}.jobs set state = 'done', version = version + 1, lease_owner = null,
        lease_expires_at = null, wake_at = null, updated_at = now()
    where tenant_id = :t and id = :k and token = :f and lease_expires_at > now()
    returning tenant_id, id, version
)
insert into {floor}.events (tenant_id, job_id, seq, to_state)
select tenant_id, id, version, 'done' from done;
\\endif
"""

KEEL_BATCH_CLAIM_COMPLETE = """
select count(*) > 0 as got, jsonb_agg(jsonb_build_object(
    'task_id', c.task_id, 'expected_version', c.state_version, 'to_state', 'done',
    'fencing_token', c.fencing_token)) as items
from keel.claim_next_tasks('bench-w' || (:client_id)::int, {batch}, '30 seconds', '{workflow}') as c
\\gset
\\if :got
select count(*) filter (where refused_sqlstate is null)
from keel.transition_tasks('{tenant}', (:items)::jsonb);
\\endif
"""

# Each client moves its own task, md5('bench-<client>'), between a and b; -D v=1 starts
# every client at the task's first version, and \\gset keeps the version it returns.
KEEL_TRANSITION = """
\\set odd :v % 2
select state_version as v from keel.transition_task(
    '{tenant}', md5('bench-' || (:client_id)::int)::uuid, :v,
    case when (:odd)::int = 1 then 'a' else 'b' end,
    p_payload => '{payload}'::jsonb, p_outbox => '{outbox}'::jsonb
)
\\gset
"""

FLOOR_TRANSITION = """
begin;
select version as v, state as s from {floor}.jobs
where tenant_id = '{tenant}' and id = md5('bench-' || (:client_id)::int)::uuid
\\gset
update {floor}.jobs set state = case when (:s)::text = 'a' then 'b' else 'a' end,
    version = version + 1, updated_at = now()
where tenant_id = '{tenant}' and id = md5('bench-' || (:client_id)::int)::uuid
    and version = :v;
insert into {floor}.events (tenant_id, job_id, seq, to_state, payload)
values ('{tenant}', md5('bench-' || (:client_id)::int)::uuid, :v + 1,
    case when (:s)::text = 'a' then 'b' else 'a' end, '{payload}'::jsonb);
insert into {floor}.outbox (tenant_id, job_id, topic, payload)
values ('{tenant}', md5('bench-' || (:client_id)::int)::uuid, 'bench.moved', '{payload}'::jsonb);
commit;
"""

# Odd calls reserve a new key, even calls replay the key of the call before (-D n=0).
KEEL_RESERVE = """
\\set n :n + 1
\\set k (:n + 1) / 2
select outcome from keel.reserve_operation(
    '{tenant}', null, 'w' || (:client_id)::int || '-' || (:k)::int, 'bench',
    'hash-' || (:client_id)::int
);
"""

FLOOR_RESERVE = """
\\set n :n + 1
\\set k (:n + 1) / 2
with inserted as (
    insert into {floor}.operations (tenant_id, key, input_hash)
    values ('{tenant}', 'w' || (:client_id)::int || '-' || (:k)::int, 'hash-' || (:client_id)::int)
    on conflict (tenant_id, key) do nothing
    returning input_hash
)
select coalesce(
    (select 'reserved' from inserted),
    (select case when o.input_hash = 'hash-' || (:client_id)::int
        then 'replayed' else 'conflict' end
     from {floor}.operations as o
     where o.tenant_id = '{tenant}' and o.key = 'w' || (:client_id)::int || '-' || (:k)::int)
);
"""

# procrastinate's own worker calls, as its worker makes them (search_path: its schema).
PEER_FETCH_FINISH = """
\\set w :client_id % 64 + 1
select j.id as j, (j.id is not null)::int as got from procrastinate_fetch_job_v2(null, :w) as j
\\gset
\\if :got
select procrastinate_finish_job_v1(:j, 'succeeded', false);
\\endif
"""

SCRIPTS: dict[str, dict[Side, str]] = {
    "claim-complete": {"keel": KEEL_CLAIM_COMPLETE, "floor": FLOOR_CLAIM_COMPLETE},
    "batch-claim-complete": {"keel": KEEL_BATCH_CLAIM_COMPLETE, "floor": FLOOR_CLAIM_COMPLETE},
    "transition": {"keel": KEEL_TRANSITION, "floor": FLOOR_TRANSITION},
    "reserve": {"keel": KEEL_RESERVE, "floor": FLOOR_RESERVE},
    "empty-claim": {"keel": KEEL_CLAIM_COMPLETE, "floor": FLOOR_CLAIM_COMPLETE},
    "peer-procrastinate": {"keel": KEEL_CLAIM_COMPLETE, "floor": PEER_FETCH_FINISH},
}
# Workloads whose operations are the tasks moved to done, not pgbench's transactions.
COUNTS_DONE = ("claim-complete", "batch-claim-complete", "peer-procrastinate")


class PgbenchError(AgentkeelError):
    """A pgbench run failed (its own message says why): the database failed the work."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ExitCode.DATABASE_ERROR)


def find_pgbench() -> Path | None:
    """pgbench beside the server binaries agentkeel uses, else on PATH."""
    from agentkeel.embedded import PostgresNotFound, find_bindir

    try:
        beside = find_bindir() / "pgbench"
        if beside.exists():
            return beside
    except PostgresNotFound:
        pass
    found = shutil.which("pgbench")
    return Path(found) if found else None


def script(world: World, workload: str, side: Side) -> str:
    """The pgbench script of one side of a workload, for this world."""
    template = SCRIPTS[workload][side]
    return template.format(
        floor=sql.Identifier(world.floor).as_string(None),
        workflow=world.workflow,
        tenant=world.tenant,
        batch=BATCH,
        payload=PAYLOAD,
        outbox=OUTBOX,
    )


def run_side_pgbench(
    world: World,
    workload: Workload,
    side: Side,
    workers: int,
    duration: float,
    progress: Callable[[float], None] | None = None,
    *,
    pgbench: Path,
) -> Run:
    """One side of a workload for `duration` seconds with `workers` pgbench clients,
    prepared statements and a log line per transaction, sampling the size and dead tuples
    of the side's tables once per slice as the Python driver does. For the claims, each
    slice's transactions are scaled by the tasks done per transaction."""
    dsn = connection_dsn(world, workload.name, side)
    before = side_rows(world, workload.name, side, "done") if workload.name in COUNTS_DONE else 0
    functions_before = function_stats(world) if side == "keel" else {}
    statements_before = statement_stats(world) if side == "keel" else {}
    tables = side_tables(world, side, workload.name)
    storage: list[tuple[float, int, int, int]] = []
    with (
        tempfile.TemporaryDirectory(prefix="agentkeel-pgbench-") as folder,
        psycopg.connect(world.dsn, autocommit=True) as monitor,
    ):

        def sample(elapsed: float) -> None:
            row = monitor.execute(STORAGE, (tables,)).fetchone()
            assert row is not None
            storage.append((elapsed, int(row[0]), int(row[1]), int(row[2])))

        path = Path(folder) / f"{workload.name}-{side}.sql"
        path.write_text(script(world, workload.name, side))
        # The password through the environment, not the command line (ps shows that).
        params = conninfo.conninfo_to_dict(dsn)
        password = params.pop("password", None)
        environment = dict(os.environ)
        if password is not None:
            environment["PGPASSWORD"] = str(password)
        command = [
            str(pgbench),
            "--no-vacuum",
            "--protocol=prepared",
            f"--client={workers}",
            f"--jobs={min(workers, 8)}",
            f"--time={max(1, round(duration))}",
            "--define=v=1",
            "--define=n=0",
            "--log",
            f"--log-prefix={Path(folder) / 'log'}",
            f"--file={path}",
            conninfo.make_conninfo(**params),  # type: ignore[arg-type]
        ]
        sample(0.0)
        began = time.monotonic()
        with subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment
        ) as child:
            try:
                next_sample = SLICE_S
                while child.poll() is None:
                    time.sleep(0.2)
                    elapsed = min(duration, time.monotonic() - began)
                    if elapsed >= next_sample:
                        sample(elapsed)
                        next_sample += SLICE_S
                    if progress is not None:
                        progress(elapsed)
                    if time.monotonic() - began > duration + 120:
                        child.kill()
                stdout, stderr = child.communicate()
            finally:
                if child.poll() is None:  # interrupted: pgbench stops with the bench
                    child.terminate()
                    child.wait(30)
        sample(duration)
        if child.returncode != 0 or "aborted" in stdout:
            last = (stderr.strip() or stdout.strip()).splitlines()[-3:]
            raise PgbenchError(
                f"pgbench {workload.name} ({side}) failed: {' / '.join(last) or child.returncode}"
            )
        entries = _log_entries(Path(folder))
    if not entries:
        raise PgbenchError(f"pgbench {workload.name} ({side}) logged no transaction")
    # The run's length is pgbench's --time, as the Python driver's is its duration, so that
    # no short last slice reads as a slowdown.
    start = min(end - latency / 1000 for end, latency in entries)
    seconds = float(max(1, round(duration)))
    ops = (
        side_rows(world, workload.name, side, "done") - before
        if workload.name in COUNTS_DONE
        else len(entries)
    )
    counts = [0] * max(1, int(seconds / SLICE_S + 0.999))
    for end, _ in entries:
        counts[min(len(counts) - 1, int((end - start) / SLICE_S))] += 1
    slices = _scaled(counts, ops)
    functions = functions_during(world, functions_before) if side == "keel" else {}
    return Run(
        workload.name,
        side,
        workers,
        seconds,
        ops,
        [latency for _, latency in entries],
        slices,
        storage,
        driver="pgbench",
        functions=functions,
        statements=statements_during(world, statements_before) if side == "keel" else [],
    )


def _scaled(counts: list[int], total: int) -> list[int]:
    """counts scaled to sum to total, rounding so that nothing is lost or made up."""
    whole = sum(counts)
    if whole == 0:
        return counts
    scaled, running, carried = [], 0, 0
    for count in counts:
        running += count
        share = running * total // whole
        scaled.append(share - carried)
        carried = share
    return scaled


LOG_LINE = re.compile(r"^\d+ \d+ (\d+) \d+ (\d+) (\d+)")


def _log_entries(folder: Path) -> list[tuple[float, float]]:
    """(end time in seconds, latency in ms) of every logged transaction. A line is
    `client transaction latency_us script epoch_s epoch_us`."""
    entries = []
    for log in folder.glob("log*"):
        for line in log.read_text().splitlines():
            match = LOG_LINE.match(line)
            if match:
                latency_us, seconds, micros = (int(g) for g in match.groups())
                entries.append((seconds + micros / 1e6, latency_us / 1000))
    return entries
