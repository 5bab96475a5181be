"""`agentkeel lint`: the SQL files, no database needed."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from agentkeel.cli.app import (
    err,
    fail,
    format_option,
    main,
)
from agentkeel.exitcodes import ExitCode
from agentkeel.lint import lint as run_lint
from agentkeel.lint import to_json as lint_json
from agentkeel.sql_files import sql_root


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
