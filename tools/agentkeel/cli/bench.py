"""`agentkeel bench`: the guarded paths against plain SQL, the relay, the tenant policy."""

from __future__ import annotations

import contextlib
import json
import statistics
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
from rich.progress import Progress
from rich.table import Table

from agentkeel.cli.app import (
    dsn_option,
    err,
    fail,
    format_option,
    main,
    out,
)
from agentkeel.exitcodes import ExitCode
from agentkeel.preflight import check_dsn
from agentkeel.target import cleanup_on_sigterm, database
from agentkeel.workloads import DEFAULT_WORKLOADS, SLICE_S, WORKLOAD_NAMES


@main.command(short_help="Measure the guarded paths against plain SQL.")
@dsn_option(
    envvar=None,
    help="A database to measure on (it writes and removes tenants and roles there); only when "
    "named: $AGENTKEEL_DSN is ignored. Default: a throwaway embedded cluster with fsync on.",
)
@click.option(
    "--workload",
    "workloads",
    multiple=True,
    type=click.Choice([*WORKLOAD_NAMES, "policy", "relay", "payload", "noisy", "worker"]),
    help="What to measure (repeatable). Default: every workload except empty-claim, policy,"
    " relay, payload, noisy and worker; peer-procrastinate when procrastinate is installed.",
)
@click.option(
    "--workers",
    default="8",
    show_default=True,
    metavar="N[,N...]",
    help="Concurrent connections, one thread each; a list measures each count.",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=1, max=3600),
    default=None,
    metavar="S",
    help="Seconds per run.  [default: 4; 180 with --sustained]",
)
@click.option("--repeats", default=2, show_default=True, help="Runs per side; the median counts.")
@click.option(
    "--finished-rows",
    default=0,
    show_default=True,
    metavar="N",
    help="Finished rows present on both sides before each run (e.g. 1000000).",
)
@click.option(
    "--sustained",
    is_flag=True,
    help="One long run per side (default 180 s) without vacuuming in between: decay shows "
    "in the per-second slices.",
)
@click.option("--rows", default=50_000, show_default=True, help="policy: tasks per tenant.")
@click.option(
    "--relay-messages",
    default=1000,
    show_default=True,
    type=click.IntRange(1, 1_000_000),
    help="relay: messages per case.",
)
@click.option(
    "--worker-tasks",
    default=2000,
    show_default=True,
    type=click.IntRange(1, 1_000_000),
    help="worker: tasks (and procrastinate jobs) per run; concurrency: each --workers count.",
)
@click.option(
    "--backlog",
    default=0,
    show_default=True,
    type=click.IntRange(0, 10_000_000),
    metavar="N",
    help="relay: also measure with N messages of another tenant held behind in-flight keys.",
)
@click.option(
    "--nats",
    "nats_url",
    default="nats://127.0.0.1:4222",
    show_default=True,
    metavar="URL",
    help="relay: the NATS server (JetStream); its cases are skipped if none answers.",
)
@click.option(
    "--driver",
    type=click.Choice(["auto", "pgbench", "python", "both"]),
    default="auto",
    show_default=True,
    help="What drives the workloads: pgbench (a C client with prepared statements: the "
    "server's cost), python (threads on psycopg: what a Python application sees), or both. "
    "auto: pgbench when it is found beside the server binaries or on PATH, else python.",
)
@format_option(json_help="the runs as one JSON document")
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    default=None,
    metavar="FILE.png",
    help="Also draw throughput over time and against workers, and table growth, as a PNG "
    "(needs the plot extra: pip install 'agentkeel[plot]').",
)
def bench(
    dsn: str | None,
    workloads: tuple[str, ...],
    workers: str,
    duration: float | None,
    repeats: int,
    finished_rows: int,
    sustained: bool,
    rows: int,
    relay_messages: int,
    worker_tasks: int,
    backlog: int,
    nats_url: str,
    driver: str,
    as_json: bool,
    plot_path: Path | None,
) -> None:
    """Run each workload (claim + complete, transition with an event and an outbox row,
    reserve) side by side with a plain-SQL floor doing the same writes with no function,
    no row-level security and no fencing, alternating floor and keel runs. Reports ops/s,
    p50/p99 latency, the ratio to the floor and throughput per second. `--workload policy`
    measures what the tenant policy costs per statement and per row; `--workload relay` the
    relay's messages per second to a file and to NATS JetStream, at batch 1 and 100 (with
    `--backlog N`, to a file again while N messages are held behind in-flight keys);
    `--workload payload` what keel.check_payload costs on 64 KiB payloads of several
    shapes; `--workload noisy` what one tenant's load costs another's claims (tasks behind
    another tenant's row locks, messages behind another tenant's flood); `--workload worker`
    the worker runtime's tasks per second with a no-op handler, against procrastinate's
    worker with a no-op task."""
    counts = _worker_counts(workers)
    chosen = list(workloads) or list(DEFAULT_WORKLOADS)
    if any(w.startswith("peer-") for w in chosen):
        from agentkeel.workloads import peer_available

        if not peer_available():
            fail(
                "--workload peer-procrastinate needs procrastinate: pip install 'agentkeel[peers]'",
                ExitCode.TOOL_MISSING,
            )
    pgbench = _pgbench_for(driver)
    drivers: list[Path | None] = (
        [None, pgbench] if driver == "both" else [pgbench if pgbench is not None else None]
    )
    if sustained:
        repeats = 1
    if duration is None:
        duration = 180.0 if sustained else 4.0
    if dsn:
        check_dsn(dsn)
    if plot_path is not None:
        try:  # before the runs, not after minutes of them
            import matplotlib  # noqa: F401
        except ImportError:
            fail("--plot needs matplotlib: pip install 'agentkeel[plot]'", ExitCode.TOOL_MISSING)
    document: dict[str, Any] = {}
    # fsync on: commits cost what they cost on a production server, on both sides. SIGTERM
    # as Ctrl-C, so that the bench's roles, schema and tenant go with it on --dsn too.
    with cleanup_on_sigterm(), database(dsn, durable=True) as target:
        if "policy" in chosen:
            document["policy"] = _bench_policy(target, rows, repeats, as_json)
            chosen.remove("policy")
        if "relay" in chosen:
            document["relay"] = _bench_relay(target, relay_messages, nats_url, backlog, as_json)
            chosen.remove("relay")
        if "payload" in chosen:
            document["payload"] = _bench_payload(target, as_json)
            chosen.remove("payload")
        if "noisy" in chosen:
            document["noisy"] = _bench_noisy(target, as_json)
            chosen.remove("noisy")
        if "worker" in chosen:
            document["worker"] = _bench_worker(target, worker_tasks, counts, repeats, as_json)
            chosen.remove("worker")
        if not chosen:
            if as_json:
                out.print_json(json.dumps(document))
            return
        from agentkeel.workloads import run as run_workloads
        from agentkeel.workloads import summarize

        total_runs = len(chosen) * len(counts) * repeats * 2 * len(drivers)
        runs: list[Any] = []
        with bench_progress(total_runs, duration, quiet=as_json) as tick:
            for path in drivers:
                done = len(runs)

                def progress(label: str, index: int, elapsed: float, done: int = done) -> None:
                    tick(label, done + index, elapsed)

                runs += run_workloads(
                    target,
                    chosen,
                    counts,
                    duration,
                    repeats,
                    progress=progress,
                    finished_rows=finished_rows,
                    vacuum=not sustained,
                    pgbench=path,
                )
    title = f"agentkeel vs plain SQL, {duration:g} s runs, median of {repeats}"
    if plot_path is not None:
        from agentkeel.bench_plot import plot

        plot(runs, plot_path, title)
        err.print(f"plot: {plot_path}")
    if as_json:
        document["runs"] = [r.as_dict() for r in runs]
        document["summary"] = [
            {
                "workload": s.workload,
                "driver": s.driver,
                "workers": s.workers,
                "floor_ops_per_s": round(s.floor.ops_per_s, 1),
                "keel_ops_per_s": round(s.keel.ops_per_s, 1),
                "ratio": round(s.ratio, 3),
                "ran_out": s.floor.exhausted or s.keel.exhausted,
                "floor_last_over_first_minute": _rounded(s.floor.minute_ratio()),
                "keel_last_over_first_minute": _rounded(s.keel.minute_ratio()),
            }
            for s in summarize(runs)
        ]
        out.print_json(json.dumps(document))
        return
    table = Table(
        "workload",
        "driver",
        "workers",
        "floor ops/s",
        "keel ops/s",
        "ratio",
        "floor p50/p99 ms",
        "keel p50/p99 ms",
        "keel ops/s first → last s",
        title=title,
    )
    summaries = summarize(runs)
    for s in summaries:
        table.add_row(
            s.workload,
            s.driver,
            str(s.workers),
            f"{s.floor.ops_per_s:,.0f}",
            f"{s.keel.ops_per_s:,.0f}",
            f"{s.ratio:.2f}x" + (" (ran out)" if s.floor.exhausted or s.keel.exhausted else ""),
            f"{s.floor.percentile(0.5):.2f} / {s.floor.percentile(0.99):.2f}",
            f"{s.keel.percentile(0.5):.2f} / {s.keel.percentile(0.99):.2f}",
            f"{s.keel.slices[0] / SLICE_S:,.0f} → {s.keel.slices[-1] / SLICE_S:,.0f}",
        )
    out.print(table)
    if any(s.floor.exhausted or s.keel.exhausted for s in summaries):
        err.print(
            "bench: (ran out): a side claimed every row loaded for it before the run ended; "
            "its ops/s is less than it could do (a shorter --duration)"
        )
    if any(s.keel.functions for s in summaries):
        out.print(_functions_table(summaries))
    else:
        err.print(
            "bench: no server time per function: only a superuser --dsn role may set "
            "track_functions for the bench's logins"
        )
    if any(s.keel.statements for s in summaries):
        out.print(_statements_table(summaries))
    out.print(_storage_table(summaries))


def _pgbench_for(driver: str) -> Path | None:
    """The pgbench to drive the workloads with, or None for the Python driver."""
    if driver == "python":
        return None
    from agentkeel.bench_pgbench import find_pgbench

    found = find_pgbench()
    if found is None and driver in ("pgbench", "both"):
        fail(
            "--driver pgbench: no pgbench beside the server binaries or on PATH "
            "(it comes with the PostgreSQL client or server packages)",
            ExitCode.TOOL_MISSING,
        )
    if found is None:
        err.print("bench: no pgbench found; the workloads run on the Python driver")
    return found


def _functions_table(summaries: list[Any]) -> Table:
    """Server time per call in each keel function (track_functions, when the --dsn role
    could set it on the bench logins), keel side of the median run: which call a
    regression is in."""
    table = Table(
        "workload",
        "driver",
        "workers",
        "function",
        "calls / op",
        "total µs / call",
        "self µs / call",
        title="server time in keel functions, the six dearest (median keel run, track_functions)",
    )
    for s in summaries:
        run = s.keel
        if not run.functions or not run.ops:
            continue
        ranked = sorted(run.functions.items(), key=lambda item: -item[1][1])
        for name, (calls, total, own) in ranked[:6]:
            table.add_row(
                s.workload,
                s.driver,
                str(s.workers),
                name.removeprefix("keel.").split("(")[0],
                f"{calls / run.ops:.2f}",
                f"{1000 * total / calls:,.1f}",
                f"{1000 * own / calls:,.1f}",
            )
    return table


def _statements_table(summaries: list[Any]) -> Table:
    """The keel side's dearest statements per operation (pg_stat_statements with track =
    all, where the server loads it: the embedded default does), those inside the keel
    functions too."""
    table = Table(
        "workload",
        "driver",
        "workers",
        "statement",
        "calls / op",
        "µs / op",
        title="the dearest statements inside the keel functions, three per workload "
        "(pg_stat_statements)",
    )
    for s in summaries:
        run = s.keel
        if not run.ops:
            continue
        for query, calls, total in run.statements[:3]:
            text = " ".join(query.split())
            table.add_row(
                s.workload,
                s.driver,
                str(s.workers),
                text if len(text) <= 90 else text[:87] + "...",
                f"{calls / run.ops:.2f}",
                f"{1000 * total / run.ops:,.1f}",
            )
    return table


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _storage_table(summaries: list[Any]) -> Table:
    """Per side: the last minute's throughput over the first (runs of two minutes or more),
    and how its tables and indexes grew and how many dead tuples they held at the end."""
    table = Table(
        "workload",
        "driver",
        "workers",
        "side",
        "last ÷ first minute",
        "tables MB start → end",
        "indexes MB start → end",
        "dead tuples at end",
        title="decay and storage over each side's median run",
    )
    for s in summaries:
        for run in (s.floor, s.keel):
            first, last = run.storage[0], run.storage[-1]
            ratio = run.minute_ratio()
            table.add_row(
                s.workload,
                s.driver,
                str(s.workers),
                run.side,
                f"{ratio:.2f}" if ratio is not None else "-",
                f"{first[1] / 1e6:,.1f} → {last[1] / 1e6:,.1f}",
                f"{first[2] / 1e6:,.1f} → {last[2] / 1e6:,.1f}",
                f"{last[3]:,}",
            )
    return table


# Without a terminal, a progress line at least this often (seconds) within a long run.
PROGRESS_EVERY = 30.0


@contextlib.contextmanager
def bench_progress(
    total_runs: int, duration: float, *, quiet: bool
) -> Iterator[Callable[[str, int, float], None]]:
    """The workloads' progress callback: a transient bar on a terminal (none with quiet, for
    --format json); elsewhere (a CI log) a line on stderr as each run starts and every
    PROGRESS_EVERY seconds of a long one, so the log never sits silent for minutes."""
    if err.is_terminal:
        with Progress(console=err, transient=True, disable=quiet) as bar:
            task = bar.add_task("bench", total=total_runs * duration)

            def tick_bar(label: str, index: int, elapsed: float) -> None:
                bar.update(task, description=label, completed=index * duration + elapsed)

            yield tick_bar
        return
    current = {"index": -1, "said": 0.0}

    def tick_line(label: str, index: int, elapsed: float) -> None:
        if index != current["index"]:
            current.update(index=index, said=0.0)
            err.print(f"bench: run {index + 1} of {total_runs}: {label}", markup=False)
        elif elapsed - current["said"] >= PROGRESS_EVERY:
            current["said"] = elapsed
            err.print(
                f"bench: run {index + 1} of {total_runs}: {label}, {elapsed:.0f} s of "
                f"{duration:g} s",
                markup=False,
            )

    yield tick_line


def say_progress(message: str) -> None:
    """One progress line on stderr where no bar is shown (not a terminal)."""
    if not err.is_terminal:
        err.print(f"bench: {message}", markup=False)


def _bench_relay(
    target: str, messages: int, nats_url: str, backlog: int, as_json: bool
) -> list[dict[str, Any]]:
    """Measure the relay; print its table unless as_json. Returns the figures."""
    from agentkeel.bench import run_relay_bench

    say_progress(
        f"the relay: {messages:,} messages to a file and to NATS, batch 1 and 100"
        + (f", then with {backlog:,} held back" if backlog else "")
    )
    measured = run_relay_bench(target, messages=messages, nats_url=nats_url, backlog=backlog)
    figures = [
        {
            "sink": r.sink,
            "batch": r.batch,
            "held_back": r.backlog,
            "messages": r.messages,
            "seconds": r.seconds,
            "per_second": r.per_second,
            "note": r.note,
        }
        for r in measured
    ]
    if as_json:
        return figures
    table = Table(
        "sink", "batch", "held back", "messages", "seconds", "messages/s", title="agentkeel relay"
    )
    for r in measured:
        table.add_row(
            r.sink,
            str(r.batch),
            f"{r.backlog:,}",
            f"{r.messages:,}",
            "" if r.seconds is None else f"{r.seconds:.2f}",
            r.note if r.per_second is None else f"{r.per_second:,.0f}",
        )
    out.print(table)
    return figures


def _bench_worker(
    target: str, tasks: int, counts: list[int], repeats: int, as_json: bool
) -> list[dict[str, Any]]:
    """The worker runtime against procrastinate's, alternating; print the table unless
    as_json. Returns the figures."""
    from agentkeel.bench_worker import run_worker_bench

    figures: list[dict[str, Any]] = []
    for concurrency in counts:
        say_progress(
            f"the worker: {tasks:,} no-op tasks at concurrency {concurrency}, against "
            "procrastinate's worker"
        )
        for r in run_worker_bench(target, tasks, concurrency, repeats):
            figures.append(
                {
                    "runtime": r.runtime,
                    "concurrency": r.concurrency,
                    "tasks": r.tasks,
                    "seconds": r.seconds,
                    "per_second": r.per_second,
                    "note": r.note,
                }
            )
    if as_json:
        return figures
    table = Table(
        "runtime", "concurrency", "tasks", "seconds", "tasks/s", title="worker runtimes, no-op"
    )
    for f in figures:
        table.add_row(
            f["runtime"],
            str(f["concurrency"]),
            f"{f['tasks']:,}",
            "" if f["seconds"] is None else f"{f['seconds']:.2f}",
            f["note"] if f["per_second"] is None else f"{f['per_second']:,.0f}",
        )
    out.print(table)
    for concurrency in counts:
        ours = [
            f["per_second"]
            for f in figures
            if f["concurrency"] == concurrency and f["runtime"] == "agentkeel worker"
        ]
        peer = [
            f["per_second"]
            for f in figures
            if f["concurrency"] == concurrency and f["runtime"] != "agentkeel worker"
        ]
        if ours and all(peer) and peer:
            ratio = statistics.median(ours) / statistics.median(peer)
            out.print(f"concurrency {concurrency}: agentkeel / procrastinate = {ratio:.2f}x")
    return figures


def _worker_counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        counts = []
    if not counts or any(n < 1 or n > 256 for n in counts):
        raise click.BadParameter("expected N or N,N,... with 1 <= N <= 256", param_hint="--workers")
    return counts


def _bench_payload(target: str, as_json: bool) -> list[dict[str, Any]]:
    """Measure the payload check; print its table unless as_json. Returns the figures."""
    from agentkeel.bench import PAYLOAD_SHAPES, run_payload_bench

    say_progress(f"the payload check: {len(PAYLOAD_SHAPES)} shapes of about 64 KiB, best of 5")
    results = run_payload_bench(target)
    figures = [
        {"shape": m.shape, "bytes": m.bytes, "best_ms": round(m.best_ms, 2)} for m in results
    ]
    if as_json:
        return figures
    table = Table("shape", "bytes", "best ms", title="keel.check_payload, best of 5")
    for m in results:
        table.add_row(m.shape, f"{m.bytes:,}", f"{m.best_ms:.1f}")
    out.print(table)
    return figures


def _bench_noisy(target: str, as_json: bool) -> list[dict[str, Any]]:
    """Measure one tenant's load on another's claims; print the table unless as_json."""
    from agentkeel.bench_noisy import CLAIMS, DUE_MESSAGES, LOCKED_ROWS, run_noisy_bench

    say_progress(
        f"noisy neighbours: tasks behind {', '.join(f'{n:,}' for n in LOCKED_ROWS)} locked rows,"
        f" messages behind {', '.join(f'{n:,}' for n in DUE_MESSAGES)} due ones"
    )
    results = run_noisy_bench(target)
    figures = [
        {
            "case": m.case,
            "noise": m.noise,
            "p50_ms": round(m.p50_ms, 2),
            "max_ms": round(m.max_ms, 2),
            "claims_until_served": m.claims_until_served,
        }
        for m in results
    ]
    if as_json:
        return figures
    table = Table(
        "case",
        "tenant A's rows",
        "p50 ms",
        "max ms",
        "claims until B is served",
        title=f"tenant B's claims while tenant A makes noise, {CLAIMS} claims each",
    )
    for m in results:
        table.add_row(
            m.case, f"{m.noise:,}", f"{m.p50_ms:.1f}", f"{m.max_ms:.1f}", str(m.claims_until_served)
        )
    out.print(table)
    return figures


def _bench_policy(target: str, rows: int, repeats: int, as_json: bool) -> list[dict[str, Any]]:
    """Measure the policy cost; print its table unless as_json. Returns the figures."""
    from agentkeel.bench import run

    say_progress(f"the tenant policy: {rows:,} tasks per tenant, {repeats} runs")
    results = run(target, rows=rows, repeats=repeats)
    figures = [
        {"case": m.case, "best_ms": round(m.best_ms, 3), "us_per_row": round(m.us_per_row, 3)}
        for m in results
    ]
    if as_json:
        return figures
    table = Table(
        "case", "best ms", "µs per row scanned", title=f"count(*) of one tenant, 2 x {rows:,} tasks"
    )
    for m in results:
        table.add_row(m.case, f"{m.best_ms:.1f}", f"{m.us_per_row:.2f}")
    out.print(table)
    return figures
