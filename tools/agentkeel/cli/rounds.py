"""`agentkeel recover`, `agentkeel watchdog` and `agentkeel purge`: work in rounds, once or
every S seconds."""

from __future__ import annotations

import json
import socket
import sys
import time
import uuid
from collections.abc import Callable

import click
import psycopg

from agentkeel.cli.app import (
    dsn_option,
    err,
    fail,
    format_option,
    main,
    out,
    require_dsn,
)
from agentkeel.exitcodes import ExitCode
from agentkeel.preflight import connect as connect_dsn
from agentkeel.preflight import require_schema
from agentkeel.target import cleanup_on_sigterm


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
    type=click.IntRange(1),
    default=100,
    show_default=True,
    help="Tasks per transaction, at most the database's settings.max_batch_items (1000 by "
    "default); a full batch is followed by another at once.",
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
    from agentkeel.recover import fit_limit, recover_once

    actor = f"agentkeel-recover@{socket.gethostname()}"[:200]

    said: set[int] = set()  # the lowered limits already reported

    def one_round(conn: psycopg.Connection, looping: bool) -> None:
        # Fitted each round: the setting may be lowered while a loop runs.
        fitted = fit_limit(conn, limit)
        if fitted < limit and fitted not in said:
            said.add(fitted)
            err.print(
                f"agentkeel: --limit lowered to settings.max_batch_items ({fitted})", markup=False
            )
        handled = 0
        while True:
            batch = recover_once(
                conn, limit=fitted, actor=actor, workflow=workflow, max_attempts=max_attempts
            )
            handled += len(batch)
            for row in batch:
                if as_json:
                    click.echo(json.dumps(row.as_json()))
                else:
                    out.print(row.describe(), markup=False)
            if len(batch) < fitted:
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


@main.command(short_help="Remove what retention says is finished with (G11).")
@dsn_option
@once_or_interval
@click.option(
    "--tenant",
    "tenants",
    type=click.UUID,
    multiple=True,
    metavar="TENANT",
    help="Only this tenant (repeatable); by default every tenant.",
)
@click.option(
    "--batch",
    type=click.IntRange(1, 100_000),
    default=1000,
    show_default=True,
    help="Rows removed per step; each step is one short transaction.",
)
@click.option("--dry-run", is_flag=True, help="Count what is due per kind; remove nothing.")
@format_option(json_help="one object per round: rows per kind and per table")
def purge(
    dsn: str | None,
    once: bool,
    interval: float | None,
    tenants: tuple[uuid.UUID, ...],
    batch: int,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Remove, tenant by tenant, what each tenant's retention periods say is finished
    with: finished tasks with everything they own, expired idempotency keys, checkpoints no
    worker resumes from, closed sessions, delivered and dead outbox messages, inbox rows.
    Never a live row, never waiting on a lock: safe beside traffic. Periods: keel.settings
    (retain_*) and keel.set_tenant_retention. Needs the owner (a keel_migrator login);
    docs/retention.md."""
    from rich.progress import Progress

    from agentkeel.purge import purge_round

    def one_round(conn: psycopg.Connection, looping: bool) -> None:
        with Progress(
            console=err, transient=True, disable=as_json or looping or not err.is_terminal
        ) as bar:
            task = bar.add_task("purging", total=None)
            report = purge_round(
                conn, batch, tenants, dry_run, progress=lambda n: bar.advance(task, n)
            )
        if as_json:
            click.echo(json.dumps(report.as_json()))
        elif not looping or report.total:
            out.print(report.describe(), markup=False)
        for tenant, error in report.failed.items():
            err.print(f"agentkeel: tenant {tenant} not purged: {error}", markup=False)
        if report.failed and not looping:
            fail(f"{len(report.failed)} tenant(s) not purged (above)", ExitCode.DATABASE_ERROR)

    run_rounds(dsn, "agentkeel-purge", once, interval, one_round)
