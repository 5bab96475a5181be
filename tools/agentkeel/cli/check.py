"""`agentkeel check`: read-only posture checks of a migrated catalog."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import click
from rich.table import Table

from agentkeel.check import (
    failing_findings,
    run_checks,
    to_json,
    to_junit,
)
from agentkeel.cli.app import (
    dsn_option,
    format_option,
    main,
    out,
    require_dsn,
)
from agentkeel.console import make_console
from agentkeel.exitcodes import ExitCode
from agentkeel.preflight import connect as connect_dsn


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
