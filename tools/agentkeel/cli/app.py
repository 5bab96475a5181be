"""The `agentkeel` command line's core: the consoles, the one error path (every failure is
one line and a documented exit code), the top-level group and the options commands share.
Each command group lives in a module of its own beside this one."""

from __future__ import annotations

import functools
import inspect
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar, overload

import click
import psycopg

from agentkeel import __version__
from agentkeel.check import (
    CheckNotPermitted,
    SchemaMissing,
)
from agentkeel.console import make_console
from agentkeel.embedded import EmbeddedError, PostgresNotFound
from agentkeel.exitcodes import AgentkeelError, ExitCode, lookup
from agentkeel.migrate import MigrationError
from agentkeel.preflight import check_dsn, first_line

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


F = TypeVar("F", bound=Callable[..., Any])


@overload
def dsn_option(func: F) -> F: ...
@overload
def dsn_option(*, envvar: str | None = ..., help: str = ...) -> Callable[[F], F]: ...
def dsn_option(
    func: F | None = None,
    *,
    envvar: str | None = "AGENTKEEL_DSN",
    help: str = "PostgreSQL connection string (default $AGENTKEEL_DSN); required.",
) -> F | Callable[[F], F]:
    """The one --dsn option. Bare (`@dsn_option`): for commands that change or inspect a
    user's database, required (require_dsn), read from $AGENTKEEL_DSN too. With arguments:
    another variable (None: the option only) and its own help."""
    decorate: Callable[[F], F] = click.option(
        "--dsn", envvar=envvar, default=None, metavar="DSN", help=help
    )
    return decorate(func) if func is not None else decorate


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
            help=f"json: {json_help}" + "".join(f"; {o}: {FORMAT_HELP[o]}" for o in others) + ".",
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
