"""The pytest plugin: options, fixtures, the guarantee marker and the guarantee table."""

from __future__ import annotations

import os
from collections import defaultdict

import pytest
from rich.console import Console
from rich.table import Table
from rich.text import Text

from agentkeel_conformance.fixtures import (  # noqa: F401  (fixtures are registered by import)
    artifacts,
    connect,
    keel,
    keel_cluster,
    keel_dsn,
    login_role,
    make_tenant,
    new_task,
    owner_dsn,
    tenant,
    throwaway_database,
    workflow,
)
from agentkeel_conformance.guarantees import GUARANTEES

OUTCOME_RANK = {"passed": 0, "skipped": 1, "failed": 2}
Results = dict[str, dict[str, tuple[str, str]]]  # guarantee -> nodeid -> (outcome, reason)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("agentkeel", "agentkeel conformance")
    group.addoption(
        "--dsn",
        default=None,
        help="Database under test (default $AGENTKEEL_DSN; else a throwaway embedded cluster).",
    )
    group.addoption(
        "--owner-dsn",
        default=None,
        help="A member of keel_owner, to remove the suite's tenants and workflows and to run the "
        "owner-only tests (default $AGENTKEEL_OWNER_DSN, else --dsn).",
    )
    group.addoption(
        "--read-only",
        action="store_true",
        default=False,
        help="Run only the catalog checks: nothing is written to the database.",
    )
    group.addoption(
        "--testcontainers",
        nargs="?",
        const="postgres:16-alpine",
        default=None,
        metavar="IMAGE",
        help="Test a PostgreSQL started in Docker (default image postgres:16-alpine).",
    )
    group.addoption(
        "--artifacts",
        default="agentkeel-artifacts",
        help="Folder for failure artifacts (default ./agentkeel-artifacts).",
    )
    group.addoption(
        "--migrate",
        action="store_true",
        default=False,
        help="Apply agentkeel migrations to the --dsn database before testing.",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "guarantee(id): the guarantee (G1-G12) the test proves")
    config.addinivalue_line(
        "markers", "chaos: kills processes, backends or the server (deselect with -m 'not chaos')"
    )
    config.addinivalue_line("markers", "read_only: writes nothing; what --read-only runs")
    if not hasattr(config, "workerinput"):  # under xdist only the controller reports
        config.pluginmanager.register(GuaranteeReport(), "agentkeel-guarantee-report")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--read-only"):
        kept = [item for item in items if item.get_closest_marker("read_only")]
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept
    for item in items:
        for mark in item.iter_markers("guarantee"):
            for gid in mark.args:
                if gid not in GUARANTEES:
                    raise pytest.UsageError(f"{item.nodeid}: unknown guarantee {gid!r}")
                item.user_properties.append(("guarantee", gid))


def _reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # a skip: (path, line, reason)
        return str(longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message).splitlines()[0]
    return str(longrepr).strip().splitlines()[-1] if longrepr else ""


def guarantee_table(results: Results) -> Table:
    table = Table(
        "guarantee",
        "title",
        "tests",
        "passed",
        "failed",
        "skipped",
        "result",
        title="agentkeel conformance",
    )
    for gid, title in GUARANTEES.items():
        tests = results.get(gid, {})
        counts = {k: sum(1 for o, _ in tests.values() if o == k) for k in OUTCOME_RANK}
        if not tests:
            verdict = Text("not covered", style="dim")
        elif counts["failed"]:
            verdict = Text("FAILED", style="bold red")
        elif counts["passed"]:
            verdict = Text("passed", style="green")
        else:
            verdict = Text("skipped", style="yellow")
        table.add_row(
            gid,
            title,
            str(len(tests)),
            str(counts["passed"]),
            str(counts["failed"]),
            str(counts["skipped"]),
            verdict,
        )
    return table


class GuaranteeReport:
    """Collects each test's outcome per guarantee and prints the table at the end."""

    def __init__(self) -> None:
        self.results: Results = defaultdict(dict)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        gids = [value for key, value in report.user_properties if key == "guarantee"]
        if not gids or (report.when != "call" and report.outcome == "passed"):
            return
        outcome = report.outcome
        reason = "" if outcome == "passed" else _reason(report)
        for gid in gids:
            previous = self.results[gid].get(report.nodeid)
            if previous is None or OUTCOME_RANK[outcome] > OUTCOME_RANK[previous[0]]:
                self.results[gid][report.nodeid] = (outcome, reason)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        writer = terminalreporter._tw
        console = Console(
            file=writer._file,
            force_terminal=writer.hasmarkup,
            width=max(writer.fullwidth, 100),
            no_color="NO_COLOR" in os.environ,
            highlight=False,
            soft_wrap=True,  # one line per failure, however long, so CI logs stay greppable
        )
        terminalreporter.write_line("")
        console.print(guarantee_table(self.results))
        for gid in GUARANTEES:
            for nodeid, (outcome, reason) in sorted(self.results.get(gid, {}).items()):
                if outcome == "passed":
                    continue
                style = "bold red" if outcome == "failed" else "yellow"
                line = Text(f"{gid} {outcome.upper()} ", style=style)
                line.append(f"{nodeid}: {reason}", style="")
                console.print(line)
