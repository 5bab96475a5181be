"""The `agentkeel` command line."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import io
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import click
import psycopg
from rich.progress import Progress
from rich.table import Table

from agentkeel import __version__
from agentkeel.bootstrap import AGENT_CONNECTION_LIMIT, Login
from agentkeel.bootstrap import Plan as BootstrapPlan
from agentkeel.bootstrap import apply as apply_bootstrap
from agentkeel.check import (
    CheckNotPermitted,
    SchemaMissing,
    failing_findings,
    run_checks,
    to_json,
    to_junit,
)
from agentkeel.console import make_console
from agentkeel.distribute import apply as apply_distribution
from agentkeel.distribute import citus_installed, read_layout, script
from agentkeel.distribute import plan as plan_distribution
from agentkeel.embedded import EmbeddedError, PostgresNotFound, find_bindir
from agentkeel.exitcodes import AgentkeelError, ExitCode, lookup, markdown_table
from agentkeel.guarantees import parse_guarantees
from agentkeel.lint import lint as run_lint
from agentkeel.lint import to_json as lint_json
from agentkeel.migrate import (
    MigrationError,
    State,
    load_sources,
    migrate_up,
    plan_for,
    plan_sql,
)
from agentkeel.preflight import check_dsn, first_line, probe_suite_database, require_schema
from agentkeel.preflight import connect as connect_dsn
from agentkeel.sql_files import sql_root
from agentkeel.suite_options import SUITE_OPTIONS, option_value, plugin_args
from agentkeel.target import cleanup_on_sigterm, database, embedded_database
from agentkeel.workloads import DEFAULT_WORKLOADS, SLICE_S, WORKLOAD_NAMES

out = make_console()
err = make_console(stderr=True)


def fail(message: str, code: ExitCode) -> NoReturn:
    raise AgentkeelError(message, code)


def classify(error: BaseException) -> tuple[ExitCode, str]:
    """The exit code and one-line message for an error; INTERNAL for anything unexpected."""
    if isinstance(error, AgentkeelError):
        return error.code, str(error)
    if isinstance(error, MigrationError):
        code = lookup(error.exit_code)
        return ExitCode.DATABASE_ERROR if code is None else code, str(error)
    if isinstance(error, PostgresNotFound):
        return ExitCode.TOOL_MISSING, str(error)
    if isinstance(error, EmbeddedError):
        return ExitCode.TOOL_MISSING, f"embedded PostgreSQL: {first_line(error)}"
    if isinstance(error, SchemaMissing):
        return ExitCode.SCHEMA_MISSING, str(error)
    if isinstance(error, CheckNotPermitted):
        return ExitCode.PERMISSION, str(error)
    if isinstance(error, KeyboardInterrupt):
        return ExitCode.INTERRUPTED, "interrupted"
    if isinstance(error, psycopg.errors.InsufficientPrivilege):
        return ExitCode.PERMISSION, f"permission denied: {first_line(error)}"
    if isinstance(error, psycopg.OperationalError) and (
        error.sqlstate is None or error.sqlstate[:2] in ("08", "28") or error.sqlstate == "3D000"
    ):
        return ExitCode.CONNECTION, f"cannot connect to the database: {first_line(error)}"
    if isinstance(error, psycopg.Error) and error.sqlstate is not None:
        return ExitCode.DATABASE_ERROR, f"database error {error.sqlstate}: {first_line(error)}"
    return ExitCode.INTERNAL, (
        f"internal error: {type(error).__name__}: {first_line(error)} "
        "(a bug in agentkeel; `agentkeel --debug ...` prints the traceback)"
    )


class AgentkeelGroup(click.Group):
    """The one error path: every failure of every command leaves here, as one line on stderr
    and a documented exit code (agentkeel.exitcodes); the traceback only under --debug."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException as e:
            if e.exit_code == ExitCode.USAGE:
                raise
            e.show()  # click's generic code 1 would read as "findings"
            sys.exit(int(ExitCode.USAGE))
        except (click.exceptions.Exit, SystemExit):
            raise
        except BaseException as e:
            code, message = classify(e)
            if ctx.params.get("debug") or (code is ExitCode.INTERNAL and _debug_env()):
                traceback.print_exception(e)
            prefix = (
                "agentkeel: "
                if code in (ExitCode.INTERNAL, ExitCode.INTERRUPTED)
                else ("agentkeel: error: ")
            )
            err.print(f"{prefix}{message}", markup=False)
            sys.exit(int(code))


def _debug_env() -> bool:
    return os.environ.get("AGENTKEEL_DEBUG", "") not in ("", "0")


def dsn_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """--dsn for commands that change or inspect a user's database: required."""
    return click.option(
        "--dsn",
        envvar="AGENTKEEL_DSN",
        default=None,
        metavar="DSN",
        help="PostgreSQL connection string (default $AGENTKEEL_DSN); required.",
    )(func)


def require_dsn(dsn: str | None) -> str:
    """The named database; refuse (usage) rather than work on a throwaway cluster."""
    ctx = click.get_current_context()
    if not dsn:
        # The variable this command's --dsn reads: bootstrap's is its own.
        envvar = next(
            (p.envvar for p in ctx.command.params if p.name == "dsn" and p.envvar),
            "AGENTKEEL_DSN",
        )
        hint = " (`agentkeel embedded` starts a throwaway one)" if envvar == "AGENTKEEL_DSN" else ""
        fail(
            f"`{ctx.command_path}` needs a database: pass --dsn or set {envvar}{hint}",
            ExitCode.USAGE,
        )
    check_dsn(dsn)
    return dsn


def format_option(*others: str, json_help: str = "JSON") -> Callable[[Any], Any]:
    """--format human|<others>|json: the one spelling of machine output on every command.
    The command receives as_json (a bool) if it has that parameter, else fmt. `--json`,
    the earlier spelling of some commands, still works, hidden and with a warning."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        wants_flag = "as_json" in inspect.signature(command).parameters

        @functools.wraps(command)
        def wrapper(*args: Any, fmt: str, json_alias: bool, **kwargs: Any) -> Any:
            if json_alias:
                err.print("agentkeel: --json is deprecated: use --format json", markup=False)
                fmt = "json"
            if wants_flag:
                kwargs["as_json"] = fmt == "json"
            else:
                kwargs["fmt"] = fmt
            return command(*args, **kwargs)

        wrapper = click.option("--json", "json_alias", is_flag=True, hidden=True)(wrapper)
        return click.option(
            "--format",
            "fmt",
            type=click.Choice(["human", *others, "json"]),
            default="human",
            show_default=True,
            help=f"json: {json_help}"
            + "".join(f"; {o}: {FORMAT_HELP[o]}" for o in others)
            + ".",
        )(wrapper)

    return decorate


# What each non-JSON machine format of --format is.
FORMAT_HELP = {"junit": "JUnit XML for CI", "github": "GitHub workflow annotations"}


@click.group(
    cls=AgentkeelGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="Exit codes: `agentkeel exit-codes` (also in docs/errors.md).",
)
@click.version_option(__version__, prog_name="agentkeel")
@click.option(
    "--debug",
    is_flag=True,
    envvar="AGENTKEEL_DEBUG",
    help="Print the traceback of an error (also $AGENTKEEL_DEBUG=1).",
)
def main(debug: bool) -> None:
    """agentkeel: a PostgreSQL schema whose database enforces what AI agents must not negotiate."""


# -- migrate ----------------------------------------------------------------


@main.group()
def migrate() -> None:
    """Apply the agentkeel schema (status, plan, up, validate)."""


def migrate_options(func: Callable[..., Any]) -> Callable[..., Any]:
    func = click.option(
        "--sql-dir",
        type=click.Path(exists=True, file_okay=False, path_type=Path),
        default=None,
        help="Folder holding schema/, functions/, policies/ (default: the installed copy).",
    )(func)
    return dsn_option(func)


def _root(sql_dir: Path | None) -> Path:
    return sql_dir if sql_dir is not None else sql_root()


@migrate.command()
@migrate_options
@format_option(json_help="the status as one JSON document")
def status(dsn: str | None, sql_dir: Path | None, as_json: bool) -> None:
    """Show each migration file and its state; exit 3 on drift or a newer database."""
    with connect_dsn(require_dsn(dsn)) as conn:
        plan = plan_for(conn, _root(sql_dir))
    pending = len(plan.to_apply)
    if as_json:
        report = {
            "migrations": [
                {
                    "name": e.name,
                    "kind": e.kind,
                    "state": e.state.value,
                    "applied_at": e.applied.applied_at.isoformat() if e.applied else None,
                }
                for e in plan.entries
            ],
            "to_apply": [m.name for m in plan.to_apply],
            "problems": list(plan.problems),
            "up_to_date": not pending and not plan.problems,
        }
        click.echo(json.dumps(report, indent=2))
    else:
        table = Table("migration", "kind", "state", "applied at")
        styles = {
            State.DRIFT: "bold red",
            State.UNKNOWN: "bold red",
            State.PENDING: "yellow",
            State.CHANGED: "yellow",
            State.REAPPLY: "yellow",
        }
        for e in plan.entries:
            table.add_row(
                e.name,
                e.kind,
                f"[{styles.get(e.state, 'green')}]{e.state.value}[/]",
                e.applied.applied_at.strftime("%Y-%m-%d %H:%M:%S") if e.applied else "",
            )
        out.print(table)
        out.print(f"{pending} to apply" if pending else "up to date")
    if plan.problems:
        raise_refused(plan.problems)


@migrate.command()
@migrate_options
@click.option(
    "--lock-timeout", default="10s", show_default=True, help="lock_timeout for each file."
)
def plan(dsn: str | None, sql_dir: Path | None, lock_timeout: str) -> None:
    """Print the SQL that `up` would run (a psql-ready script); change nothing."""
    with connect_dsn(require_dsn(dsn)) as conn:
        result = plan_for(conn, _root(sql_dir))
        if result.problems:
            raise_refused(result.problems)
        script = plan_sql(result.to_apply, lock_timeout, conn)
    click.echo(script, nl=False)


def raise_refused(problems: list[str]) -> NoReturn:
    for problem in problems[:-1]:
        err.print(f"agentkeel: {problem}", markup=False)
    fail(problems[-1], ExitCode.REFUSED)


@migrate.command()
@migrate_options
@click.option(
    "--lock-timeout", default="10s", show_default=True, help="lock_timeout for each file."
)
@click.option(
    "--lock-wait",
    default=300.0,
    show_default=True,
    type=float,
    help="Seconds to wait for another migrator to finish.",
)
@click.option("--dry-run", is_flag=True, help="Same as `plan`: print the SQL, change nothing.")
def up(
    dsn: str | None, sql_dir: Path | None, lock_timeout: str, lock_wait: float, dry_run: bool
) -> None:
    """Apply pending migrations: all or nothing, in one transaction (no-transaction files after)."""
    if dry_run:
        click.get_current_context().invoke(
            plan, dsn=dsn, sql_dir=sql_dir, lock_timeout=lock_timeout
        )
        return
    root = _root(sql_dir)
    started = time.monotonic()
    load_sources(root)  # malformed files fail before we touch the database
    with connect_dsn(require_dsn(dsn)) as conn:

        def waiting(pid: int | None) -> None:
            err.print(f"agentkeel: waiting for another migrator (backend pid {pid}) to finish")

        seen: set[str] = set()
        again: list[str] = []

        def applied(mig: Any, ms: int) -> None:
            # policies/ run once more after no-transaction files: say so, count files once.
            if mig.name in seen:
                again.append(mig.name)
                out.print(f"re-applied {mig.name} after the no-transaction files ({ms} ms)")
                return
            seen.add(mig.name)
            out.print(f"applied {mig.name} ({ms} ms)")

        done = migrate_up(
            conn,
            root,
            lock_timeout=lock_timeout,
            lock_wait=lock_wait,
            on_wait=waiting,
            on_applied=applied,
        )
    if done:
        twice = f", {len(again)} of them twice" if again else ""
        out.print(f"{len(done)} files applied{twice} in {time.monotonic() - started:.1f}s")
    else:
        out.print("nothing to do: the database is up to date")


@migrate.command()
@migrate_options
def validate(dsn: str | None, sql_dir: Path | None) -> None:
    """Exit 0 only when everything is applied and nothing drifted."""
    with connect_dsn(require_dsn(dsn)) as conn:
        result = plan_for(conn, _root(sql_dir))
    if result.problems:
        raise_refused(result.problems)
    pending = [m.name for m in result.to_apply]
    if pending:
        fail(f"{len(pending)} migration(s) not applied: {', '.join(pending)}", ExitCode.FINDINGS)
    out.print("valid: every migration is applied and unchanged")


# -- check ----------------------------------------------------------------------


@main.command(short_help="Read-only posture checks of the catalog.")
@dsn_option
@format_option("junit", json_help="the findings as one JSON document")
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the report to a file instead of standard output.",
)
def check(dsn: str | None, fmt: str, output: Path | None) -> None:
    """Read-only posture checks of the catalog; exit 1 on any error (warnings pass)."""
    with connect_dsn(require_dsn(dsn), autocommit=False) as conn:
        results = run_checks(conn)
    findings = [f for fs in results.values() for f in fs]
    if fmt == "json":
        report = to_json(results)
    elif fmt == "junit":
        report = to_junit(results)
    else:
        report = None
    if report is not None:
        if output is not None:
            output.write_text(report + "\n", encoding="utf-8")
        else:
            click.echo(report)
    else:
        table = Table(
            "rule", "guarantee", "level", "object", "problem", "remedy", title="agentkeel check"
        )
        for f in findings:
            table.add_row(f.rule, f.guarantee, f.level, f.object, f.problem, f.remedy)
        buffer = io.StringIO()
        console = make_console(file=buffer) if output else out
        if findings:
            console.print(table)
        failing = len(failing_findings(results))
        console.print(
            f"{failing} error(s), {len(findings) - failing} warning(s) in {len(results)} rules"
            if findings
            else f"all {len(results)} rules pass: {', '.join(sorted(results))}"
        )
        if output is not None:
            output.write_text(buffer.getvalue(), encoding="utf-8")
    if failing_findings(results):
        sys.exit(ExitCode.FINDINGS)


# -- lint -------------------------------------------------------------------------


@main.command("lint", short_help="Lint SQL files; no database needed.")
@click.argument("paths", nargs=-1, type=click.Path(exists=True, path_type=Path))
@format_option("github", json_help="the findings as one JSON document")
@click.option("--no-citus", is_flag=True, help="Skip the citus rule family.")
@click.option("--static-only", is_flag=True, help="Skip sqlfluff and squawk.")
def lint_command(paths: tuple[Path, ...], fmt: str, no_citus: bool, static_only: bool) -> None:
    """Lint SQL files (default: the schema/, functions/ and policies/ agentkeel ships)."""
    root = Path.cwd().resolve() if paths else sql_root().resolve()
    targets = [p.resolve() for p in paths] or [
        root / folder for folder in ("schema", "functions", "policies") if (root / folder).is_dir()
    ]
    try:
        findings = run_lint(targets, root, citus=not no_citus, tools=not static_only)
    except FileNotFoundError as e:  # a linter (squawk) is not installed
        fail(str(e), ExitCode.TOOL_MISSING)
    if fmt == "json":
        click.echo(lint_json(findings))
    else:
        for f in findings:
            click.echo(f.github() if fmt == "github" else f.human())
        if fmt == "human":
            err.print(f"{len(findings)} finding(s)" if findings else "no findings")
    if findings:
        sys.exit(ExitCode.FINDINGS)


# -- bench ------------------------------------------------------------------------


@main.command(short_help="Measure the guarded paths against plain SQL.")
@click.option(
    "--dsn",
    default=None,
    metavar="DSN",
    help="A database to measure on (it writes and removes tenants and roles there); only when "
    "named: $AGENTKEEL_DSN is ignored. Default: a throwaway embedded cluster with fsync on.",
)
@click.option(
    "--workload",
    "workloads",
    multiple=True,
    type=click.Choice([*WORKLOAD_NAMES, "policy", "relay"]),
    help="What to measure (repeatable). Default: every workload except empty-claim, policy"
    " and relay.",
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
    backlog: int,
    nats_url: str,
    as_json: bool,
    plot_path: Path | None,
) -> None:
    """Run each workload (claim + complete, transition with an event and an outbox row,
    reserve) side by side with a plain-SQL floor doing the same writes with no function,
    no row-level security and no fencing, alternating floor and keel runs. Reports ops/s,
    p50/p99 latency, the ratio to the floor and throughput per second. `--workload policy`
    measures what the tenant policy costs per statement and per row; `--workload relay` the
    relay's messages per second to a file and to NATS JetStream, at batch 1 and 100 (with
    `--backlog N`, to a file again while N messages are held behind in-flight keys)."""
    counts = _worker_counts(workers)
    chosen = list(workloads) or list(DEFAULT_WORKLOADS)
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
    # fsync on: commits cost what they cost on a production server, on both sides
    with database(dsn, durable=True) as target:
        if "policy" in chosen:
            document["policy"] = _bench_policy(target, rows, repeats, as_json)
            chosen.remove("policy")
        if "relay" in chosen:
            document["relay"] = _bench_relay(target, relay_messages, nats_url, backlog, as_json)
            chosen.remove("relay")
        if not chosen:
            if as_json:
                out.print_json(json.dumps(document))
            return
        from agentkeel.workloads import run as run_workloads
        from agentkeel.workloads import summarize

        total_runs = len(chosen) * len(counts) * repeats * 2
        with bench_progress(total_runs, duration, quiet=as_json) as tick:
            runs = run_workloads(
                target,
                chosen,
                counts,
                duration,
                repeats,
                progress=tick,
                finished_rows=finished_rows,
                vacuum=not sustained,
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
                "workers": s.workers,
                "floor_ops_per_s": round(s.floor.ops_per_s, 1),
                "keel_ops_per_s": round(s.keel.ops_per_s, 1),
                "ratio": round(s.ratio, 3),
                "floor_last_over_first_minute": _rounded(s.floor.minute_ratio()),
                "keel_last_over_first_minute": _rounded(s.keel.minute_ratio()),
            }
            for s in summarize(runs)
        ]
        out.print_json(json.dumps(document))
        return
    table = Table(
        "workload",
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
            str(s.workers),
            f"{s.floor.ops_per_s:,.0f}",
            f"{s.keel.ops_per_s:,.0f}",
            f"{s.ratio:.2f}x",
            f"{s.floor.percentile(0.5):.2f} / {s.floor.percentile(0.99):.2f}",
            f"{s.keel.percentile(0.5):.2f} / {s.keel.percentile(0.99):.2f}",
            f"{s.keel.slices[0] / SLICE_S:,.0f} → {s.keel.slices[-1] / SLICE_S:,.0f}",
        )
    out.print(table)
    out.print(_storage_table(summaries))


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _storage_table(summaries: list[Any]) -> Table:
    """Per side: the last minute's throughput over the first (runs of two minutes or more),
    and how its tables and indexes grew and how many dead tuples they held at the end."""
    table = Table(
        "workload",
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


def _worker_counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        counts = []
    if not counts or any(n < 1 or n > 256 for n in counts):
        raise click.BadParameter("expected N or N,N,... with 1 <= N <= 256", param_hint="--workers")
    return counts


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


# -- relay -----------------------------------------------------------------------


@main.group(
    invoke_without_command=True,
    short_help="Deliver the outbox to NATS JetStream, HTTP, a file or stdout.",
)
@dsn_option
@click.option(
    "--sink",
    metavar="URL",
    default=None,
    help="nats://host:port/subject.prefix, http(s)://..., file:PATH, or - (stdout). Required.",
)
@click.option(
    "--batch",
    default=100,
    show_default=True,
    type=click.IntRange(1, 1000),
    help="Messages per claim (1 to 1000).",
)
@click.option(
    "--concurrency",
    default=32,
    show_default=True,
    type=click.IntRange(1, 1000),
    help="Publishes in flight at once within a batch.",
)
@click.option(
    "--lease",
    default=30.0,
    show_default=True,
    type=click.FloatRange(0.001),
    help="Seconds a claim lasts; keep it longer than a batch takes to publish.",
)
@click.option(
    "--poll-interval",
    default=1.0,
    show_default=True,
    type=click.FloatRange(0.01),
    help="Seconds between claims when no NOTIFY arrives.",
)
@click.option(
    "--wake-cooldown",
    default=0.1,
    show_default=True,
    type=click.FloatRange(0),
    help="Least seconds between an empty claim and the next, however many NOTIFYs arrive.",
)
@click.option(
    "--timeout",
    default=5.0,
    show_default=True,
    type=click.FloatRange(0.01),
    help="Seconds a publish (NATS, HTTP) may take before it counts as failed.",
)
@click.option(
    "--db-timeout",
    default=60.0,
    show_default=True,
    type=click.FloatRange(0.1),
    help="Seconds a database call may take before the connection is dropped and remade.",
)
@click.option(
    "--status-interval",
    default=60.0,
    show_default=True,
    type=click.FloatRange(0),
    help="Seconds between status lines (delivered, retried, dead, pending, lag); 0: none.",
)
@click.option(
    "--once",
    is_flag=True,
    help="Deliver what is due, then exit 0; exit 6 if the sink cannot be reached.",
)
@click.option("--no-listen", is_flag=True, help="Poll only (no LISTEN keel_outbox).")
@click.option(
    "--topic-prefix",
    default=None,
    metavar="PREFIX",
    help="Deliver only topics starting with PREFIX.",
)
@click.option(
    "--name",
    default=None,
    metavar="NAME",
    help="This relay's name in keel.outbox.claimed_by (default host:pid).",
)
@click.option(
    "--no-prepare",
    is_flag=True,
    help="No prepared statements (PgBouncer in transaction mode before 1.21).",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
@click.pass_context
def relay(
    ctx: click.Context,
    dsn: str | None,
    sink: str | None,
    batch: int,
    concurrency: int,
    lease: float,
    poll_interval: float,
    wake_cooldown: float,
    timeout: float,
    db_timeout: float,
    status_interval: float,
    once: bool,
    no_listen: bool,
    topic_prefix: str | None,
    name: str | None,
    no_prepare: bool,
    log_level: str,
) -> None:
    """Deliver outbox messages at least once: claim a batch (lease + fencing token), publish
    it, ack each message only after the sink confirmed it. SIGTERM / Ctrl-C finish the
    publishes in flight, ack them, release the other claims and exit 0. Logs are JSON lines
    on stderr. `agentkeel relay status` shows the outbox per topic. Guide: docs/relay.md."""
    if ctx.invoked_subcommand is not None:
        return
    import asyncio
    from datetime import timedelta

    from agentkeel.relay import Config, Failpoints, parse_sink, run
    from agentkeel.relay.logs import configure

    if not sink:
        fail(
            "`agentkeel relay` needs --sink URL (nats://, http(s)://, file:PATH or -)",
            ExitCode.USAGE,
        )
    target = parse_sink(sink, timeout=timeout)
    failpoints = Failpoints()
    # The same refusals as every command (a bad option value is usage, exit 2; unreachable
    # is exit 6), before the relay's own asynchronous connection.
    connect_dsn(require_dsn(dsn), application_name="agentkeel-relay").close()
    config = Config(
        dsn=require_dsn(dsn),
        batch=batch,
        concurrency=concurrency,
        lease=timedelta(seconds=lease),
        poll_interval=poll_interval,
        wake_cooldown=wake_cooldown,
        once=once,
        listen=not no_listen,
        topic_prefix=topic_prefix,
        prepare=not no_prepare,
        db_timeout=db_timeout,
        status_interval=status_interval,
    )
    if name:
        config.name = name
    configure(log_level)
    asyncio.run(run(config, target, failpoints))


@relay.command("status")
@dsn_option
@format_option(json_help="one object per topic")
def relay_status(dsn: str | None, as_json: bool) -> None:
    """Pending, in flight, dead, the oldest pending age, and what was delivered in the last
    minute and hour, per topic."""
    from agentkeel.relay.status import age_text, read_status

    with connect_dsn(require_dsn(dsn)) as conn:
        require_schema(conn)
        topics = read_status(conn)
    if as_json:
        click.echo(json.dumps({"topics": [t.as_json() for t in topics]}, indent=2))
        return
    table = Table(
        "topic",
        "pending",
        "in flight",
        "dead",
        "oldest pending",
        "delivered 1 min",
        "delivered 1 h",
        "per s",
        title="outbox",
    )
    for t in topics:
        table.add_row(
            t.topic,
            str(t.pending),
            str(t.in_flight),
            f"[bold red]{t.dead}[/]" if t.dead else "0",
            age_text(t.oldest_pending_age),
            f"{t.delivered_last_minute:,}",
            f"{t.delivered_last_hour:,}",
            f"{t.per_second:,.1f}",
        )
    out.print(table)
    if not topics:
        out.print("the outbox is empty")


@relay.group("dead")
def relay_dead() -> None:
    """List or replay dead messages of every tenant (a keel_relay login; no payloads)."""


def _dead_filter(tenant: str | None, topic: str | None, ids: tuple[str, ...]) -> Any:
    import uuid

    from agentkeel.relay.dead import Filter

    def parse(value: str, what: str) -> uuid.UUID:
        try:
            return uuid.UUID(value)
        except ValueError:
            fail(f"{what} {value!r} is not a uuid", ExitCode.USAGE)

    return Filter(
        tenant=None if tenant is None else parse(tenant, "--tenant"),
        topic=topic,
        ids=tuple(parse(i, "--id") for i in ids),
    )


dead_filters = [
    click.option("--tenant", default=None, metavar="UUID", help="Only this tenant's."),
    click.option("--topic", default=None, metavar="TOPIC", help="Only this topic's."),
    click.option("--id", "ids", multiple=True, metavar="UUID", help="Only this message (repeat)."),
]


def with_dead_filters(command: Callable[..., None]) -> Callable[..., None]:
    for option in reversed(dead_filters):
        command = option(command)
    return command


@relay_dead.command("list")
@dsn_option
@with_dead_filters
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1), help="At most.")
@format_option(json_help="one object per message")
def relay_dead_list(
    dsn: str | None,
    tenant: str | None,
    topic: str | None,
    ids: tuple[str, ...],
    limit: int,
    as_json: bool,
) -> None:
    """Dead messages, oldest death first: tenant, id, topic, attempts, claims, last error."""
    from agentkeel.relay.dead import dead_messages

    where = _dead_filter(tenant, topic, ids)
    with connect_dsn(require_dsn(dsn)) as conn:
        require_schema(conn)
        found = list(dead_messages(conn, where, limit))
    if as_json:
        click.echo(json.dumps({"dead": [m.as_json() for m in found]}, indent=2))
        return
    table = Table("dead at", "tenant", "message", "topic", "attempts", "claims", "last error")
    for m in found:
        table.add_row(
            m.dead_at.isoformat(timespec="seconds"),
            str(m.tenant_id),
            str(m.message_id),
            m.topic,
            str(m.attempts),
            str(m.claims),
            (m.last_error or "")[:120],
        )
    out.print(table)
    out.print(
        f"{len(found)} dead message(s)" + (f" (--limit {limit})" if len(found) == limit else "")
    )


@relay_dead.command("replay")
@dsn_option
@with_dead_filters
@click.option("--all", "everything", is_flag=True, help="Every dead message (no filter).")
@click.option("--dry-run", is_flag=True, help="Say what would be replayed; change nothing.")
@format_option(json_help="what was replayed, as JSON")
def relay_dead_replay(
    dsn: str | None,
    tenant: str | None,
    topic: str | None,
    ids: tuple[str, ...],
    everything: bool,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Put dead messages back to pending under the same ids (attempts and claims 0), each
    in its own transaction. Needs --tenant, --topic, --id or --all."""
    from agentkeel.relay.dead import dead_messages, replay

    where = _dead_filter(tenant, topic, ids)
    if where.empty != everything:
        fail(
            "name what to replay with --tenant, --topic or --id, or pass --all (not both)",
            ExitCode.USAGE,
        )
    replayed: list[str] = []
    skipped = 0
    with connect_dsn(require_dsn(dsn)) as conn:
        require_schema(conn)
        found = list(dead_messages(conn, where))
        for m in found:
            if dry_run or replay(conn, m):
                replayed.append(str(m.message_id))
            else:
                skipped += 1
    if as_json:
        document = {"dry_run": dry_run, "replayed": replayed, "no_longer_dead": skipped}
        click.echo(json.dumps(document, indent=2))
        return
    verb = "would replay" if dry_run else "replayed"
    out.print(
        f"{verb} {len(replayed)} dead message(s)"
        + (f"; {skipped} no longer dead" if skipped else "")
    )


# -- bootstrap -------------------------------------------------------------------


@main.command(short_help="Print (or run) the DBA's script: migrator, database, logins.")
@click.option(
    "--dsn",
    envvar="AGENTKEEL_BOOTSTRAP_DSN",
    default=None,
    metavar="DSN",
    help="With --apply: a superuser or CREATEROLE connection ($AGENTKEEL_BOOTSTRAP_DSN).",
)
@click.option("--apply", "apply_", is_flag=True, help="Run the script; default: print it.")
@click.option("--database", default="agentkeel", show_default=True, help="Database to create.")
@click.option(
    "--citus",
    is_flag=True,
    help="For a Citus cluster: the database exists (citus on every node, workers added); the"
    " script runs in it, so that every role reaches every node, and hands it to the migrator.",
)
@click.option(
    "--migrator", default="agentkeel_migrator", show_default=True, help="Migrator login to create."
)
@click.option("--app-login", "app_logins", multiple=True, metavar="NAME", help="keel_app login.")
@click.option(
    "--worker-login", "worker_logins", multiple=True, metavar="NAME", help="keel_worker login."
)
@click.option(
    "--agent-login", "agent_logins", multiple=True, metavar="NAME", help="keel_agent login."
)
@click.option(
    "--agent-connection-limit",
    type=click.IntRange(1, 10_000),
    default=AGENT_CONNECTION_LIMIT,
    show_default=True,
    metavar="N",
    help="CONNECTION LIMIT of each --agent-login.",
)
@click.option(
    "--watchdog-login",
    "watchdog_logins",
    multiple=True,
    metavar="NAME",
    help="keel_watchdog login (also pg_read_all_stats, pg_signal_backend).",
)
@click.option(
    "--password-from-env",
    "password_envs",
    multiple=True,
    metavar="LOGIN=VAR",
    help="With --apply: set LOGIN's password from $VAR (sent as a SCRAM verifier). Printed "
    "scripts use psql's \\password instead.",
)
def bootstrap(
    dsn: str | None,
    apply_: bool,
    database: str,
    citus: bool,
    migrator: str,
    app_logins: tuple[str, ...],
    worker_logins: tuple[str, ...],
    agent_logins: tuple[str, ...],
    agent_connection_limit: int,
    watchdog_logins: tuple[str, ...],
    password_envs: tuple[str, ...],
) -> None:
    """Print the psql script that creates the migrator login (LOGIN CREATEROLE), the
    database it owns, application logins in keel_app / keel_worker / keel_agent with
    their group's role settings, and watchdog logins; --apply --dsn runs it. Roles are
    cluster-wide."""
    logins = [
        Login(name, group, agent_connection_limit if group == "keel_agent" else None)
        for group, names in (
            ("keel_app", app_logins),
            ("keel_worker", worker_logins),
            ("keel_agent", agent_logins),
            ("keel_watchdog", watchdog_logins),
        )
        for name in names
    ]
    plan = BootstrapPlan(database, migrator, logins, citus)
    if not apply_:
        if password_envs:
            fail(
                "--password-from-env needs --apply: a printed script holds no secret",
                ExitCode.USAGE,
            )
        click.echo(plan.script(), nl=False)
        return
    passwords: dict[str, str] = {}
    known = {migrator, *(login.name for login in logins)}
    for item in password_envs:
        login, sep, var = item.partition("=")
        if not sep or login not in known:
            fail(
                f"--password-from-env {item!r}: expected LOGIN=VAR for a login this command "
                f"creates ({', '.join(sorted(known))})",
                ExitCode.USAGE,
            )
        if not os.environ.get(var):
            fail(f"--password-from-env {item!r}: ${var} is not set or empty", ExitCode.USAGE)
        passwords[login] = os.environ[var]
    with connect_dsn(require_dsn(dsn)) as conn:
        for stmt in apply_bootstrap(conn, plan, passwords):
            out.print(stmt, markup=False)
    unset = sorted(known - passwords.keys())
    if unset:
        out.print(
            f"no password set for {', '.join(unset)}: psql's \\password sets one", markup=False
        )
    out.print("bootstrapped")


# -- distribute ------------------------------------------------------------------


@main.command(short_help="Print (or run) the Citus distribution script.")
@dsn_option
@click.option(
    "--apply", "apply_", is_flag=True, help="Run the script (needs Citus); default: print it."
)
@click.option(
    "--shard-count",
    type=click.IntRange(1, 64000),
    default=None,
    metavar="N",
    help="Shards of the tenant tables still to distribute (default: Citus' citus.shard_count,"
    " 32). The cross-tenant claim scans every shard: fewer shards, cheaper claims.",
)
def distribute(dsn: str | None, apply_: bool, shard_count: int | None) -> None:
    """Print (or run) the Citus distribution step for the current schema."""
    with connect_dsn(require_dsn(dsn)) as conn:
        require_schema(conn)
        layout = read_layout(conn)
        if not apply_:
            click.echo(script(layout, shard_count), nl=False)
            return
        if not citus_installed(conn):
            fail(
                "the citus extension is not installed in this database: create extension citus "
                "on every node first (the script was not run)",
                ExitCode.TOOL_MISSING,
            )
        steps = plan_distribution(layout, shard_count)
        if not steps:
            out.print("already distributed: nothing to do")
            return
        for stmt in apply_distribution(conn, steps):
            out.print(stmt, markup=False)
        for step in steps:
            for note in step.notes:
                out.print(f"note: {note}", markup=False)
    out.print("distributed")


# -- recover and watchdog: rounds, once or every S seconds ------------------------


def once_or_interval(command: Callable[..., None]) -> Callable[..., None]:
    """The --once / --interval options of a command that runs in rounds."""
    command = click.option(
        "--interval",
        type=click.FloatRange(min=0.1),
        default=None,
        metavar="S",
        help="Run every S seconds until interrupted.",
    )(command)
    return click.option("--once", is_flag=True, help="One round now, then exit (the default).")(
        command
    )


def run_rounds(
    dsn: str | None,
    application_name: str,
    once: bool,
    interval: float | None,
    one_round: Callable[[psycopg.Connection, bool], None],
) -> None:
    """Connect, then call one_round(conn, looping) once, or every interval seconds until
    interrupted (SIGTERM, a supervisor's stop, like Ctrl-C)."""
    if once and interval is not None:
        fail("--once and --interval exclude each other", ExitCode.USAGE)
    with (
        cleanup_on_sigterm(),
        connect_dsn(require_dsn(dsn), application_name=application_name) as conn,
    ):
        require_schema(conn)
        while True:
            one_round(conn, interval is not None)
            sys.stdout.flush()
            if interval is None:
                return
            time.sleep(interval)


@main.command(short_help="Take over tasks whose lease expired (the recoverer).")
@dsn_option
@once_or_interval
@click.option(
    "--limit",
    type=click.IntRange(1, 10_000),
    default=100,
    show_default=True,
    help="Tasks per transaction; a full batch is followed by another at once.",
)
@click.option("--workflow", default=None, help="Only tasks of this workflow.")
@click.option(
    "--max-attempts",
    type=click.IntRange(min=0),
    default=None,
    help="Recoveries before a task fails: settings.max_recovery_attempts, or fewer.",
)
@format_option(json_help="one object per task handled")
def recover(
    dsn: str | None,
    once: bool,
    interval: float | None,
    limit: int,
    workflow: str | None,
    max_attempts: int | None,
    as_json: bool,
) -> None:
    """Take over every task whose lease expired unreleased (its worker died or stalled):
    the fencing token increments, a RECOVERED event is written and the task is due again
    for claim_next_task; past the maximum of recovery attempts the task fails with a
    RECOVERY_EXHAUSTED event. Needs a login in keel_worker (or the owner)."""
    from agentkeel.recover import recover_once

    actor = f"agentkeel-recover@{socket.gethostname()}"[:200]

    def one_round(conn: psycopg.Connection, looping: bool) -> None:
        handled = 0
        while True:
            batch = recover_once(
                conn, limit=limit, actor=actor, workflow=workflow, max_attempts=max_attempts
            )
            handled += len(batch)
            for row in batch:
                if as_json:
                    click.echo(json.dumps(row.as_json()))
                else:
                    out.print(row.describe(), markup=False)
            if len(batch) < limit:
                break
        if not as_json and (not looping or handled):
            out.print(f"{handled} stale task(s) handled", markup=False)

    run_rounds(dsn, "agentkeel-recover", once, interval, one_round)


@main.command(short_help="End agent and worker backends past the caps (the watchdog).")
@dsn_option
@once_or_interval
@click.option("--dry-run", is_flag=True, help="Report the backends past a cap; end none.")
@format_option(json_help="one object per backend")
def watchdog(
    dsn: str | None, once: bool, interval: float | None, dry_run: bool, as_json: bool
) -> None:
    """End every backend of a keel_agent or keel_worker member in this database whose
    statement, open transaction or idle time inside a transaction is past its cap in
    keel.settings, whatever the session set (role settings are only defaults). Needs a
    login in keel_watchdog with pg_read_all_stats and pg_signal_backend (bootstrap
    --watchdog-login)."""
    from agentkeel.watchdog import watch_once

    def one_round(conn: psycopg.Connection, looping: bool) -> None:
        rows = watch_once(conn, terminate=not dry_run)
        for row in rows:
            if as_json:
                click.echo(json.dumps(row.as_json()))
            else:
                out.print(row.describe(), markup=False)
        if not as_json and (not looping or rows):
            verb = "past a cap" if dry_run else "ended"
            out.print(f"{len(rows)} backend(s) {verb}", markup=False)

    run_rounds(dsn, "agentkeel-watchdog", once, interval, one_round)


# -- conformance --------------------------------------------------------------


def conformance_command(extra: list[str]) -> list[str]:
    """pytest with the suite's own ini (-c), so the caller's pytest configuration stays out.

    The suite is located, not imported: tools/agentkeel never imports agentkeel_conformance.
    """
    spec = importlib.util.find_spec("agentkeel_conformance")
    if spec is None or spec.origin is None:
        fail("the agentkeel_conformance package is not installed", ExitCode.TOOL_MISSING)
    suite = Path(spec.origin).parent
    plugins = ["-p", "agentkeel_conformance.plugin"]
    if importlib.util.find_spec("xdist") is not None:
        plugins += ["-p", "xdist.plugin"]  # autoload is off, and -n needs it
    return [
        sys.executable,
        "-m",
        "pytest",
        "-c",
        str(suite / "pytest.ini"),
        "--rootdir",
        str(suite),
        "--noconftest",
        *plugins,
        "-p",
        "no:cacheprovider",
        "--pyargs",
        "agentkeel_conformance",
        *extra,
    ]


# Seconds the suite gets to tear down (stop the embedded cluster, delete its tenants) after
# Ctrl-C / SIGTERM was forwarded to it, before it is killed.
TEARDOWN_GRACE = 60.0

# pytest's own exit codes, as agentkeel reports them (pytest.ExitCode: 0 ok, 1 tests failed,
# 2 interrupted, 3 internal error, 4 usage error, 5 no tests collected). Codes the plugin
# exits with itself (agentkeel.exitcodes, none of 2-5) pass through unchanged.
PYTEST_CODES = {
    0: ExitCode.OK,
    1: ExitCode.FINDINGS,
    2: ExitCode.INTERRUPTED,
    3: ExitCode.INTERNAL,
    4: ExitCode.USAGE,
    5: ExitCode.USAGE,
}


def suite_options_help() -> str:
    lines = ["\b", "The suite's own options (and any of `pytest --help`):"]
    for option in SUITE_OPTIONS:
        if option.name == "dsn":
            continue  # the command's own option, above
        lines += textwrap.wrap(
            option.help,
            width=78,
            initial_indent=f"  {option.usage():<25} ",
            subsequent_indent=" " * 28,
            break_on_hyphens=False,
        )
    return "\n".join(lines)


def run_suite(command: list[str], env: dict[str, str]) -> tuple[int, str | None]:
    """Run pytest in its own process group; forward Ctrl-C / SIGTERM to it once, as a SIGINT,
    and wait (up to TEARDOWN_GRACE) for its teardown. A second signal, or the grace running
    out, kills it. Returns (pytest's exit code, the signal's name or None).

    The handlers are installed before pytest starts: a handled signal is reset to its
    default in the child, so pytest gets a working Ctrl-C even when this process was started
    with SIGINT ignored (`agentkeel conformance &` in a non-interactive shell), which it
    would otherwise inherit and ignore the forwarded SIGINT."""
    received: list[int] = []
    procs: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT if len(received) == 1 else signal.SIGKILL)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        proc = subprocess.Popen(command, env=env, process_group=0)
        procs.append(proc)
        if received:  # a signal that came while pytest was being started
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
        deadline: float | None = None
        while True:
            if received and deadline is None:
                deadline = time.monotonic() + TEARDOWN_GRACE
            try:
                code = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if deadline is not None and time.monotonic() > deadline:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    received.append(signal.SIGKILL)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if not received:
        return code, None
    if len(received) > 1:
        fail(
            "interrupted: the suite was killed before its teardown finished; an embedded "
            "cluster (agentkeel-pg-* in the temp folder) or the suite's tenants "
            "(agentkeel-conformance-*) may remain",
            ExitCode.INTERRUPTED,
        )
    return code, signal.Signals(received[0]).name


@main.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    short_help="Run the conformance suite (pytest options pass through).",
    epilog=suite_options_help(),
)
@click.option(
    "--dsn",
    envvar="AGENTKEEL_DSN",
    default=None,
    metavar="DSN",
    help="The database under test (default $AGENTKEEL_DSN; without one, a throwaway "
    "embedded cluster).",
)
@click.argument("pytest_args", nargs=-1, type=click.UNPROCESSED)
def conformance(dsn: str | None, pytest_args: tuple[str, ...]) -> None:
    """Run the conformance suite; extra arguments go to pytest (-x, -k, -n 2, --junitxml=...)."""
    args = plugin_args(list(pytest_args))  # --owner-dsn -> the plugin's --keel-owner-dsn
    flags = {a.split("=", 1)[0] for a in args}
    guarantees = option_value(args, "--keel-guarantee")
    if guarantees is not None:
        try:
            parse_guarantees(guarantees)
        except ValueError as e:
            fail(str(e), ExitCode.USAGE)
    # Fail fast, before pytest starts: one line and one exit code, not an error per test.
    if dsn:
        probe_suite_database(
            dsn, migrate="--keel-migrate" in flags, read_only="--keel-read-only" in flags
        )
    elif "--keel-testcontainers" not in flags:
        find_bindir()
    # The caller's pytest plugins and options stay out: the suite must behave the same everywhere.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    if dsn:
        env["AGENTKEEL_DSN"] = dsn
    code, interrupted = run_suite(conformance_command(args), env)
    if interrupted is not None:
        fail(
            f"interrupted ({interrupted}): the suite ran its teardown and stopped",
            ExitCode.INTERRUPTED,
        )
    mapped = PYTEST_CODES.get(code, lookup(code))
    if mapped is None:
        mapped = ExitCode.INTERNAL
    if code == 5:
        fail(
            "no test ran: the selection (-k, -m, --read-only, --guarantee) matched nothing",
            mapped,
        )
    if code == 3:
        fail("pytest reported an internal error (above)", mapped)
    sys.exit(int(mapped))


# -- embedded -----------------------------------------------------------------


@main.command(short_help="Start a throwaway PostgreSQL and print its DSN.")
def embedded() -> None:
    """Start a throwaway, migrated PostgreSQL, print its DSN, and remove it on Ctrl-C."""
    # Started in the background by a non-interactive shell (`agentkeel embedded &` in a
    # script), a process inherits SIGINT ignored, and Ctrl-C or `kill -INT` would never
    # remove the cluster.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with embedded_database() as target:  # SIGTERM: KeyboardInterrupt too (target.py)
            # The DSN alone on stdout (`dsn=$(agentkeel embedded | head -1)`); how to use it
            # and how to stop it on stderr.
            out.print(target, markup=False)
            sys.stdout.flush()
            err.print(
                f"agentkeel: a migrated throwaway PostgreSQL is running; use it with\n"
                f"  export AGENTKEEL_DSN='{target}'\n"
                f"Ctrl-C (or kill -INT / kill -TERM {os.getpid()}) stops it and removes its data.",
                markup=False,
            )
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        fail("interrupted: the embedded cluster was stopped and removed", ExitCode.INTERRUPTED)


# -- errors ---------------------------------------------------------------------


@main.command()
def errors() -> None:
    """List the SQLSTATEs agentkeel raises."""
    from agentkeel.errors import ERRORS

    table = Table("sqlstate", "name", "exception")
    for code, cls in sorted(ERRORS.items()):
        table.add_row(code, cls.name, f"agentkeel.errors.{cls.__name__}")
    out.print(table)


@main.command("exit-codes")
@click.option("--markdown", is_flag=True, help="As the table in docs/errors.md.")
def exit_codes(markdown: bool) -> None:
    """List agentkeel's exit codes."""
    if markdown:
        click.echo(markdown_table(), nl=False)
        return
    table = Table("code", "name", "meaning")
    for member in ExitCode:
        table.add_row(str(member.value), member.name, member.description)
    out.print(table)


if __name__ == "__main__":
    main()
