"""`agentkeel distribute`: the Citus distribution step."""

from __future__ import annotations

import click

from agentkeel.cli.app import (
    dsn_option,
    fail,
    main,
    out,
    require_dsn,
)
from agentkeel.distribute import apply as apply_distribution
from agentkeel.distribute import citus_installed, read_layout, script
from agentkeel.distribute import plan as plan_distribution
from agentkeel.exitcodes import ExitCode
from agentkeel.preflight import connect as connect_dsn
from agentkeel.preflight import require_schema


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
