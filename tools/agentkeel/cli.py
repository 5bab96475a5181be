"""The `agentkeel` command line."""

from __future__ import annotations

import importlib.util
import io
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import click
import psycopg
from rich.console import Console
from rich.table import Table

from agentkeel import __version__
from agentkeel.check import SchemaMissing, failing_findings, run_checks, to_json, to_junit
from agentkeel.distribute import citus_installed, read_layout, script, statements
from agentkeel.embedded import EmbeddedError, PostgresNotFound
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
from agentkeel.sql_files import sql_root
from agentkeel.target import connect, database, embedded_database

EXIT_FINDINGS = 1
EXIT_REFUSED = 3
EXIT_DATABASE = 4
EXIT_NO_POSTGRES = 5

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def fail(message: str, code: int) -> NoReturn:
    err.print(f"agentkeel: error: {message}", markup=False)
    sys.exit(code)


@contextmanager
def handled() -> Iterator[None]:
    """One line on stderr and a documented exit code for every expected failure."""
    try:
        yield
    except MigrationError as e:
        fail(str(e), e.exit_code)
    except PostgresNotFound as e:
        fail(str(e), EXIT_NO_POSTGRES)
    except EmbeddedError as e:
        fail(f"embedded PostgreSQL: {e}", EXIT_NO_POSTGRES)
    except FileNotFoundError as e:
        fail(str(e), 2)
    except psycopg.OperationalError as e:
        fail(f"cannot use the database: {str(e).strip().splitlines()[0]}", EXIT_DATABASE)
    except psycopg.Error as e:
        fail(f"database error {e.sqlstate}: {str(e).strip().splitlines()[0]}", EXIT_DATABASE)


def dsn_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--dsn",
        envvar="AGENTKEEL_DSN",
        default=None,
        metavar="DSN",
        help="PostgreSQL connection string (default $AGENTKEEL_DSN; without one, a throwaway "
        "embedded cluster).",
    )(func)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="agentkeel")
def main() -> None:
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
def status(dsn: str | None, sql_dir: Path | None) -> None:
    """Show each migration file and whether it is applied."""
    with (
        handled(),
        database(dsn, migrated=False) as target,
        connect(target, autocommit=True) as conn,
    ):
        plan = plan_for(conn, _root(sql_dir))
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
    for problem in plan.problems:
        err.print(f"agentkeel: {problem}", markup=False)
    pending = len(plan.to_apply)
    out.print(f"{pending} to apply" if pending else "up to date")


@migrate.command()
@migrate_options
@click.option(
    "--lock-timeout", default="10s", show_default=True, help="lock_timeout for each file."
)
def plan(dsn: str | None, sql_dir: Path | None, lock_timeout: str) -> None:
    """Print the SQL that `up` would run (a psql-ready script); change nothing."""
    with (
        handled(),
        database(dsn, migrated=False) as target,
        connect(target, autocommit=True) as conn,
    ):
        result = plan_for(conn, _root(sql_dir))
        if result.problems:
            raise_refused(result.problems)
    click.echo(plan_sql(result.to_apply, lock_timeout), nl=False)


def raise_refused(problems: list[str]) -> NoReturn:
    for problem in problems[:-1]:
        err.print(f"agentkeel: {problem}", markup=False)
    fail(problems[-1], EXIT_REFUSED)


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
    """Apply pending migrations, each file in its own transaction."""
    if dry_run:
        click.get_current_context().invoke(
            plan, dsn=dsn, sql_dir=sql_dir, lock_timeout=lock_timeout
        )
        return
    root = _root(sql_dir)
    started = time.monotonic()
    with handled():
        load_sources(root)  # malformed files fail before we touch the database
    with (
        handled(),
        database(dsn, migrated=False) as target,
        connect(target, autocommit=True) as conn,
    ):

        def waiting(pid: int | None) -> None:
            err.print(f"agentkeel: waiting for another migrator (backend pid {pid}) to finish")

        def applied(mig: Any, ms: int) -> None:
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
        out.print(f"{len(done)} applied in {time.monotonic() - started:.1f}s")
    else:
        out.print("nothing to do: the database is up to date")


@migrate.command()
@migrate_options
def validate(dsn: str | None, sql_dir: Path | None) -> None:
    """Exit 0 only when everything is applied and nothing drifted."""
    with (
        handled(),
        database(dsn, migrated=False) as target,
        connect(target, autocommit=True) as conn,
    ):
        result = plan_for(conn, _root(sql_dir))
    if result.problems:
        raise_refused(result.problems)
    pending = [m.name for m in result.to_apply]
    if pending:
        fail(f"{len(pending)} migration(s) not applied: {', '.join(pending)}", EXIT_FINDINGS)
    out.print("valid: every migration is applied and unchanged")


# -- check ----------------------------------------------------------------------


@main.command()
@dsn_option
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["human", "json", "junit"]),
    default="human",
    show_default=True,
)
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the report to a file instead of standard output.",
)
def check(dsn: str | None, fmt: str, output: Path | None) -> None:
    """Read-only posture checks of the catalog; exit 1 on any error (warnings pass)."""
    with handled(), database(dsn) as target, connect(target) as conn:
        try:
            results = run_checks(conn)
        except SchemaMissing as e:
            fail(str(e), EXIT_DATABASE)
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
        console = Console(
            file=io.StringIO() if output else None,
            record=output is not None,
            highlight=False,
            width=200,
        )
        if findings:
            console.print(table)
        failing = len(failing_findings(results))
        console.print(
            f"{failing} error(s), {len(findings) - failing} warning(s) in {len(results)} rules"
            if findings
            else f"all {len(results)} rules pass: {', '.join(sorted(results))}"
        )
        if output is not None:
            output.write_text(console.export_text(), encoding="utf-8")
    if failing_findings(results):
        sys.exit(EXIT_FINDINGS)


# -- lint -------------------------------------------------------------------------


@main.command("lint")
@click.argument("paths", nargs=-1, type=click.Path(exists=True, path_type=Path))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["human", "json", "github"]),
    default="human",
    show_default=True,
    help="github: workflow annotations.",
)
@click.option("--no-citus", is_flag=True, help="Skip the citus rule family.")
@click.option("--static-only", is_flag=True, help="Skip sqlfluff and squawk.")
def lint_command(paths: tuple[Path, ...], fmt: str, no_citus: bool, static_only: bool) -> None:
    """Lint SQL files (default: the schema/, functions/ and policies/ agentkeel ships)."""
    root = Path.cwd().resolve() if paths else sql_root().resolve()
    targets = [p.resolve() for p in paths] or [
        root / folder for folder in ("schema", "functions", "policies") if (root / folder).is_dir()
    ]
    with handled():
        findings = run_lint(targets, root, citus=not no_citus, tools=not static_only)
    if fmt == "json":
        click.echo(lint_json(findings))
    else:
        for f in findings:
            click.echo(f.github() if fmt == "github" else f.human())
        if fmt == "human":
            err.print(f"{len(findings)} finding(s)" if findings else "no findings")
    if findings:
        sys.exit(EXIT_FINDINGS)


# -- bench ------------------------------------------------------------------------


@main.command()
@dsn_option
@click.option("--rows", default=50_000, show_default=True, help="Tasks per tenant (two tenants).")
@click.option("--repeats", default=3, show_default=True, help="Runs per case; the best counts.")
def bench(dsn: str | None, rows: int, repeats: int) -> None:
    """Measure the cost of the tenant policy: per statement (index) and per row (scan)."""
    from agentkeel.bench import run

    with handled(), database(dsn) as target:
        results = run(target, rows=rows, repeats=repeats)
    table = Table(
        "case", "best ms", "µs per row scanned", title=f"count(*) of one tenant, 2 x {rows:,} tasks"
    )
    for m in results:
        table.add_row(m.case, f"{m.best_ms:.1f}", f"{m.us_per_row:.2f}")
    out.print(table)


# -- distribute ------------------------------------------------------------------


@main.command()
@dsn_option
@click.option(
    "--apply", "apply_", is_flag=True, help="Run the script (needs Citus); default: print it."
)
def distribute(dsn: str | None, apply_: bool) -> None:
    """Print (or run) the Citus distribution step for the current schema."""
    with handled(), database(dsn) as target, connect(target, autocommit=True) as conn:
        text = script(read_layout(conn))
        if not apply_:
            click.echo(text, nl=False)
            return
        if not citus_installed(conn):
            fail(
                "the citus extension is not installed in this database: create extension citus "
                "on every node first (the script was not run)",
                EXIT_DATABASE,
            )
        for stmt in statements(text):
            out.print(stmt)
            conn.execute(stmt.encode())
    out.print("distributed")


# -- conformance --------------------------------------------------------------


def conformance_command(extra: list[str]) -> list[str]:
    """pytest with the suite's own ini (-c), so the caller's pytest configuration stays out.

    The suite is located, not imported: tools/agentkeel never imports agentkeel_conformance.
    """
    spec = importlib.util.find_spec("agentkeel_conformance")
    if spec is None or spec.origin is None:
        fail("the agentkeel_conformance package is not installed", 2)
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


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@dsn_option
@click.argument("pytest_args", nargs=-1, type=click.UNPROCESSED)
def conformance(dsn: str | None, pytest_args: tuple[str, ...]) -> None:
    """Run the conformance suite; extra arguments go to pytest (e.g. -x, -k, --junitxml)."""
    # The caller's pytest plugins and options stay out: the suite must behave the same everywhere.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    if dsn:
        env["AGENTKEEL_DSN"] = dsn
    try:
        code = subprocess.call(conformance_command(list(pytest_args)), env=env)
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


# -- embedded -----------------------------------------------------------------


@main.command()
def embedded() -> None:
    """Start a throwaway, migrated PostgreSQL, print its DSN, and remove it on Ctrl-C."""
    with handled(), embedded_database() as target:
        out.print(target)
        sys.stdout.flush()
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


# -- errors ---------------------------------------------------------------------


@main.command()
def errors() -> None:
    """List the SQLSTATEs agentkeel raises."""
    from agentkeel.errors import ERRORS

    table = Table("sqlstate", "name", "exception")
    for code, cls in sorted(ERRORS.items()):
        table.add_row(code, cls.name, f"agentkeel.errors.{cls.__name__}")
    out.print(table)


if __name__ == "__main__":
    main()
