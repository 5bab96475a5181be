"""The pytest plugin: options, fixtures, the guarantee marker and the guarantee table."""

from __future__ import annotations

import io
import os
import sys
from collections import defaultdict

import pytest
from rich.console import Console
from rich.table import Table
from rich.text import Text

from agentkeel.embedded import PostgresNotFound, find_bindir
from agentkeel.exitcodes import AgentkeelError, ExitCode
from agentkeel.preflight import connect as connect_dsn
from agentkeel.preflight import probe_suite_database
from agentkeel.suite_options import SUITE_OPTIONS
from agentkeel_conformance.connections import NO_PREPARE_ENV
from agentkeel_conformance.guarantees import GUARANTEES, parse_guarantees
from agentkeel_conformance.harness import INCONCLUSIVE
from agentkeel_conformance.signing_keys import SigningKeyCleanup

# The suite's fixtures, registered the pytest way.
pytest_plugins = ["agentkeel_conformance.fixtures"]

OUTCOME_RANK = {"passed": 0, "skipped": 1, "failed": 2}
Results = dict[str, dict[str, tuple[str, str]]]  # guarantee -> nodeid -> (outcome, reason)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("agentkeel", "agentkeel conformance")
    for option in SUITE_OPTIONS:
        group.addoption(option.flag, **option.addoption_kwargs())


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "guarantee(id): the guarantee (G1-G12) the test proves")
    config.addinivalue_line(
        "markers", "chaos: kills processes, backends or the server (deselect with -m 'not chaos')"
    )
    config.addinivalue_line("markers", "read_only: writes nothing; what --read-only runs")
    if config.getoption("--keel-no-prepare", False):  # seen by xdist and race worker processes
        os.environ[NO_PREPARE_ENV] = "1"
    if not hasattr(config, "workerinput"):  # under xdist only the controller reports
        config.pluginmanager.register(
            GuaranteeReport(
                selected_guarantees(config),
                config.getoption("--keel-strict", False),
                subset=bool(config.option.keyword or config.option.markexpr),
            ),
            "agentkeel-guarantee-report",
        )
        # A database the suite did not make (not the embedded cluster, not a container,
        # which are thrown away) and may write to: the signing key of its first mint.
        dsn = config.getoption("--keel-dsn", None) or os.environ.get("AGENTKEEL_DSN")
        if (
            dsn
            and not config.getoption("--keel-read-only", False)
            and not config.getoption("--keel-testcontainers", None)
        ):
            owner = (
                config.getoption("--keel-owner-dsn", None)
                or os.environ.get("AGENTKEEL_OWNER_DSN")
                or dsn
            )
            config.pluginmanager.register(SigningKeyCleanup(owner), "agentkeel-signing-key-cleanup")


def selected_guarantees(config: pytest.Config) -> frozenset[str] | None:
    """The guarantees --keel-guarantee names (None: all); an unknown id is a usage error."""
    value = config.getoption("--keel-guarantee", None)
    if value is None:
        return None
    try:
        return parse_guarantees(str(value))
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> int | None:
    """Fail fast: a malformed DSN, an unreachable host, a wrong password, a role without grants
    or no server binaries is one line and one exit code (agentkeel.exitcodes) before any test
    runs, not an error per test. Under xdist only the controller checks."""
    if (
        hasattr(config, "workerinput")
        or config.option.help
        or config.option.version
        or config.getoption("--keel-testcontainers")
    ):
        return None
    try:
        preflight(config)
    except AgentkeelError as e:
        sys.stderr.write(f"agentkeel: error: {e}\n")
        # pytest's own usage code; agentkeel's (2) would read as pytest's "interrupted"
        return int(pytest.ExitCode.USAGE_ERROR) if e.code == ExitCode.USAGE else int(e.code)
    return None


def preflight(config: pytest.Config) -> None:
    dsn = config.getoption("--keel-dsn") or os.environ.get("AGENTKEEL_DSN")
    if not dsn:
        try:
            find_bindir()
        except PostgresNotFound as e:
            raise AgentkeelError(str(e), ExitCode.TOOL_MISSING) from None
        return
    probe_suite_database(
        dsn,
        "--keel-dsn",
        migrate=config.getoption("--keel-migrate"),
        read_only=config.getoption("--keel-read-only"),
    )
    owner = config.getoption("--keel-owner-dsn") or os.environ.get("AGENTKEEL_OWNER_DSN")
    if owner:
        connect_dsn(owner, "--keel-owner-dsn").close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:  # every test, selected or not: a mistyped id is never just skipped
        for mark in item.iter_markers("guarantee"):
            for gid in mark.args:
                if gid not in GUARANTEES:
                    raise pytest.UsageError(f"{item.nodeid}: unknown guarantee {gid!r}")
    if config.getoption("--keel-read-only"):
        kept = [item for item in items if item.get_closest_marker("read_only")]
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept
    selected = selected_guarantees(config)
    if selected is not None:
        kept = [
            item
            for item in items
            if selected.intersection(g for m in item.iter_markers("guarantee") for g in m.args)
        ]
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept
    for item in items:
        for mark in item.iter_markers("guarantee"):
            for gid in mark.args:
                item.user_properties.append(("guarantee", gid))


def _reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # a skip: (path, line, reason)
        return str(longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message).splitlines()[0]
    return str(longrepr).strip().splitlines()[-1] if longrepr else ""


def verdict(
    results: Results, gid: str, selected: frozenset[str] | None = None, subset: bool = False
) -> str:
    """What the table says of one guarantee: FAILED, not selected, not covered, passed,
    partial (n of m ran: the rest skipped), or skipped (none ran). With subset (-k or -m
    chose the tests), a guarantee none of whose tests ran was not selected."""
    tests = results.get(gid, {})
    counts = {k: sum(1 for o, _ in tests.values() if o == k) for k in OUTCOME_RANK}
    if counts["failed"]:
        return "FAILED"
    if selected is not None and gid not in selected:
        return "not selected"  # some of its tests may have run, as tests of another too
    if not tests:
        return "not selected" if subset else "not covered"
    if counts["passed"] and counts["skipped"]:
        return f"partial ({counts['passed']} of {len(tests)} ran)"
    if counts["passed"]:
        return "passed"
    return "skipped"


VERDICT_STYLES = {
    "FAILED": "bold red",
    "not selected": "dim",
    "not covered": "dim",
    "passed": "green",
    "partial": "yellow",
    "skipped": "yellow",
}


def guarantee_table(
    results: Results, selected: frozenset[str] | None = None, subset: bool = False
) -> Table:
    table = Table(title="agentkeel conformance")
    # Only the title may wrap: a verdict cut over two lines ("partial (104 of" / "105
    # ran)") is unreadable to a person and to every script that reads the table.
    table.add_column("guarantee", no_wrap=True)
    table.add_column("title")
    for count in ("tests", "passed", "failed", "skipped"):
        table.add_column(count, no_wrap=True)
    table.add_column("result", no_wrap=True)
    for gid, title in GUARANTEES.items():
        tests = results.get(gid, {})
        counts = {k: sum(1 for o, _ in tests.values() if o == k) for k in OUTCOME_RANK}
        said = verdict(results, gid, selected, subset)
        table.add_row(
            gid,
            title,
            str(len(tests)),
            str(counts["passed"]),
            str(counts["failed"]),
            str(counts["skipped"]),
            Text(said, style=VERDICT_STYLES[said.split(" (")[0]]),
        )
    return table


def short_of_strict(results: Results, selected: frozenset[str] | None = None) -> list[str]:
    """The guarantees `--strict` fails the run for: partial or skipped, each with its
    verdict (guarantees not selected or not covered are not counted)."""
    found = []
    for gid in GUARANTEES:
        said = verdict(results, gid, selected)
        if said == "skipped" or said.startswith("partial"):
            found.append(f"{gid} {said}")
    return found


class GuaranteeReport:
    """Collects each test's outcome per guarantee and prints the table at the end."""

    def __init__(
        self, selected: frozenset[str] | None = None, strict: bool = False, subset: bool = False
    ) -> None:
        self.results: Results = defaultdict(dict)
        self.selected = selected
        self.strict = strict
        self.subset = subset  # -k or -m chose the tests

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """With --strict, a run whose tests all passed still fails when a selected
        guarantee was only partly (or not at all) tested."""
        if (
            self.strict
            and exitstatus == pytest.ExitCode.OK
            and short_of_strict(self.results, self.selected)
        ):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        gids = [str(value) for key, value in report.user_properties if key == "guarantee"]
        if not gids or (report.when != "call" and report.outcome == "passed"):
            return
        outcome = report.outcome
        reason = "" if outcome == "passed" else _reason(report)
        for gid in gids:
            previous = self.results[gid].get(report.nodeid)
            if previous is None or OUTCOME_RANK[outcome] > OUTCOME_RANK[previous[0]]:
                self.results[gid][report.nodeid] = (outcome, reason)

    def pytest_terminal_summary(
        self, terminalreporter: pytest.TerminalReporter, exitstatus: int
    ) -> None:
        if exitstatus == pytest.ExitCode.INTERRUPTED:
            return  # a partial table would read as "not covered"; the run was stopped
        # Rendered to text, then written through the reporter's public API.
        writer = terminalreporter.config.get_terminal_writer()
        rendered = io.StringIO()
        console = Console(
            file=rendered,
            force_terminal=writer.hasmarkup,
            width=max(writer.fullwidth, 100),
            no_color="NO_COLOR" in os.environ,
            highlight=False,
            soft_wrap=True,  # one line per failure, however long, so CI logs stay greppable
        )
        console.print(guarantee_table(self.results, self.selected, self.subset))
        if self.subset:
            console.print(
                "-k or -m selected some of the tests: each verdict says what those tests"
                " found, not what the guarantee's whole set would."
            )
        if self.strict:
            for short in short_of_strict(self.results, self.selected):
                console.print(Text(f"--strict: {short}", style="bold red"))
        for gid in GUARANTEES:
            for nodeid, (outcome, reason) in sorted(self.results.get(gid, {}).items()):
                if outcome == "passed":
                    continue
                style = "bold red" if outcome == "failed" else "yellow"
                label = outcome.upper()
                if outcome == "skipped" and reason.startswith(INCONCLUSIVE):
                    label, reason = "INCONCLUSIVE", reason.removeprefix(INCONCLUSIVE)
                line = Text(f"{gid} {label} ", style=style)
                line.append(f"{nodeid}: {reason}", style="")
                console.print(line)
        terminalreporter.write_line("")
        terminalreporter.write(rendered.getvalue())
