"""`agentkeel errors` and `agentkeel exit-codes`: the reference tables."""

from __future__ import annotations

import click
from rich.table import Table

from agentkeel.cli.app import (
    main,
    out,
)
from agentkeel.exitcodes import ExitCode, markdown_table


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
