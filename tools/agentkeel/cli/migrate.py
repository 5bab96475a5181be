"""`agentkeel migrate`: status, plan, up, validate."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.table import Table

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
from agentkeel.migrate import (
    State,
    load_sources,
    migrate_up,
    plan_for,
    plan_sql,
)
from agentkeel.preflight import connect as connect_dsn
from agentkeel.sql_files import sql_root


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
