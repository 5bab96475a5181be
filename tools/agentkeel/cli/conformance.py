"""`agentkeel conformance`: the suite, run by pytest in a process group of its own."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import FrameType

import click

from agentkeel.cli.app import (
    dsn_option,
    fail,
    main,
)
from agentkeel.embedded import find_bindir
from agentkeel.exitcodes import ExitCode, lookup
from agentkeel.guarantees import parse_guarantees
from agentkeel.preflight import probe_suite_database
from agentkeel.suite_options import SUITE_OPTIONS, option_value, plugin_args


def conformance_command(extra: list[str]) -> list[str]:
    """pytest with the suite's own ini (-c), so the caller's pytest configuration stays out.

    The suite is located, not imported: tools/agentkeel never imports agentkeel_conformance.
    """
    spec = importlib.util.find_spec("agentkeel_conformance")
    if spec is None or spec.origin is None:
        fail("the agentkeel_conformance package is not installed", ExitCode.TOOL_MISSING)
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


# Seconds the suite gets to tear down (stop the embedded cluster, delete its tenants) after
# Ctrl-C / SIGTERM was forwarded to it, before it is killed.
TEARDOWN_GRACE = 60.0

# pytest's own exit codes, as agentkeel reports them (pytest.ExitCode: 0 ok, 1 tests failed,
# 2 interrupted, 3 internal error, 4 usage error, 5 no tests collected). Codes the plugin
# exits with itself (agentkeel.exitcodes, none of 2-5) pass through unchanged.
PYTEST_CODES = {
    0: ExitCode.OK,
    1: ExitCode.FINDINGS,
    2: ExitCode.INTERRUPTED,
    3: ExitCode.INTERNAL,
    4: ExitCode.USAGE,
    5: ExitCode.USAGE,
}


def suite_options_help() -> str:
    lines = ["\b", "The suite's own options (and any of `pytest --help`):"]
    for option in SUITE_OPTIONS:
        if option.name == "dsn":
            continue  # the command's own option, above
        lines += textwrap.wrap(
            option.help,
            width=78,
            initial_indent=f"  {option.usage():<25} ",
            subsequent_indent=" " * 28,
            break_on_hyphens=False,
        )
    return "\n".join(lines)


def run_suite(command: list[str], env: dict[str, str]) -> tuple[int, str | None]:
    """Run pytest in its own process group; forward Ctrl-C / SIGTERM to it once, as a SIGINT,
    and wait (up to TEARDOWN_GRACE) for its teardown. A second signal, or the grace running
    out, kills it. Returns (pytest's exit code, the signal's name or None).

    The handlers are installed before pytest starts: a handled signal is reset to its
    default in the child, so pytest gets a working Ctrl-C even when this process was started
    with SIGINT ignored (`agentkeel conformance &` in a non-interactive shell), which it
    would otherwise inherit and ignore the forwarded SIGINT."""
    received: list[int] = []
    procs: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT if len(received) == 1 else signal.SIGKILL)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if received:  # stopped before pytest started: nothing to start or tear down
            return 2, signal.Signals(received[0]).name
        proc = subprocess.Popen(command, env=env, process_group=0)
        procs.append(proc)
        deadline: float | None = None
        while True:
            if received and deadline is None:
                deadline = time.monotonic() + TEARDOWN_GRACE
            try:
                code = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if deadline is not None and time.monotonic() > deadline:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    received.append(signal.SIGKILL)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if not received:
        return code, None
    if len(received) > 1:
        fail(
            "interrupted: the suite was killed before its teardown finished; an embedded "
            "cluster (agentkeel-pg-* in the temp folder) or the suite's tenants "
            "(agentkeel-conformance-*) may remain",
            ExitCode.INTERRUPTED,
        )
    return code, signal.Signals(received[0]).name


@main.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    short_help="Run the conformance suite (pytest options pass through).",
    epilog=suite_options_help(),
)
@dsn_option(
    help="The database under test (default $AGENTKEEL_DSN; without one, a throwaway "
    "embedded cluster).",
)
@click.argument("pytest_args", nargs=-1, type=click.UNPROCESSED)
def conformance(dsn: str | None, pytest_args: tuple[str, ...]) -> None:
    """Run the conformance suite; extra arguments go to pytest (-x, -k, -n 2, --junitxml=...)."""
    args = plugin_args(list(pytest_args))  # --owner-dsn -> the plugin's --keel-owner-dsn
    flags = {a.split("=", 1)[0] for a in args}
    guarantees = option_value(args, "--keel-guarantee")
    if guarantees is not None:
        try:
            parse_guarantees(guarantees)
        except ValueError as e:
            fail(str(e), ExitCode.USAGE)
    # Fail fast, before pytest starts: one line and one exit code, not an error per test.
    if dsn:
        probe_suite_database(
            dsn, migrate="--keel-migrate" in flags, read_only="--keel-read-only" in flags
        )
    elif "--keel-testcontainers" not in flags:
        find_bindir()
    # The caller's pytest plugins and options stay out: the suite must behave the same everywhere.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    if dsn:
        env["AGENTKEEL_DSN"] = dsn
    code, interrupted = run_suite(conformance_command(args), env)
    if interrupted is not None:
        fail(
            f"interrupted ({interrupted}): the suite ran its teardown and stopped",
            ExitCode.INTERRUPTED,
        )
    mapped = PYTEST_CODES.get(code, lookup(code))
    if mapped is None:
        mapped = ExitCode.INTERNAL
    if code == 5:
        fail(
            "no test ran: the selection (-k, -m, --read-only, --guarantee) matched nothing",
            mapped,
        )
    if code == 3:
        fail("pytest reported an internal error (above)", mapped)
    sys.exit(int(mapped))
