"""Progress lines for the project's tests where no terminal shows them (CI, a log file).

With `-n 2` pytest prints a dot per test: half an hour of dots says nothing of how far the
run is or whether it is stuck. Where stdout is not a terminal, or under CI, the controller
writes a line every $AGENTKEEL_TEST_PROGRESS_SECONDS (60) seconds: tests done of
collected, failures so far, time elapsed.
"""

from __future__ import annotations

import os
import sys
import time

import pytest

ENV = "AGENTKEEL_TEST_PROGRESS_SECONDS"


class ProgressLines:
    def __init__(self, config: pytest.Config, every: float) -> None:
        self.config = config
        self.every = every
        self.total: int | None = None
        self.done = 0
        self.failed: set[str] = set()  # node ids: a test failing in call and teardown once
        self.started = time.monotonic()
        self.said = self.started

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if self.total is None:  # without xdist; with it, the workers collect
            self.total = len(session.items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: object, ids: list[str]) -> None:
        self.total = len(ids)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:
            self.failed.add(report.nodeid)
        if report.when != "teardown":
            return
        self.done += 1
        now = time.monotonic()
        if now - self.said < self.every and self.done != self.total:
            return
        self.said = now
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        minutes, seconds = divmod(int(now - self.started), 60)
        # On a line of its own: the dots before it do not end theirs.
        reporter.write(
            f"\nprogress: {self.done} of {self.total if self.total is not None else '?'} "
            f"tests, {len(self.failed)} failed, {minutes}:{seconds:02d} elapsed\n"
        )


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the controller reports
        return
    in_ci = os.environ.get("CI", "").lower() not in ("", "0", "false", "no")
    if sys.stdout.isatty() and not in_ci:
        return
    every = float(os.environ.get(ENV) or "60")
    config.pluginmanager.register(ProgressLines(config, every), "agentkeel-progress-lines")
