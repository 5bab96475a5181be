"""Ctrl-C during `agentkeel conformance`: exit 130 with one line, and the suite's teardown ran:
no postmaster of its embedded cluster left, its temp folder gone; with --dsn nothing of the
suite left in the user's database. Real signals to a real subprocess."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from agentkeel.exitcodes import ExitCode
from conftest import AGENTKEEL

# Long enough that the signal lands while a test runs.
SELECTION = ("-k", "race or interleavings or g1")


@pytest.fixture
def private_tmp() -> Iterator[Path]:
    """The suite's TMPDIR, readable by the postgres OS user when the tests run as root."""
    folder = Path(tempfile.mkdtemp(prefix="agentkeel-interrupt-", dir="/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def start(args: list[str], tmp: Path, *, sigint_ignored: bool = False) -> subprocess.Popen[str]:
    """sigint_ignored: as a non-interactive shell starts `agentkeel conformance &`."""
    env = {k: v for k, v in os.environ.items() if k != "AGENTKEEL_DSN"}
    env["TMPDIR"] = str(tmp)
    return subprocess.Popen(
        [*AGENTKEEL, "conformance", *args, "-q", *SELECTION],
        cwd=tmp,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a shell gives a foreground job
        preexec_fn=_ignore_sigint if sigint_ignored else None,
    )


def wait_for(condition: Callable[[], bool], proc: subprocess.Popen[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the suite ended before the signal: {proc.communicate()}")
        if condition():
            return
        time.sleep(0.05)
    pytest.fail("the suite never got going")


def interrupt(proc: subprocess.Popen[str], target: str) -> tuple[str, str]:
    if target == "group":  # Ctrl-C in a terminal: every process of the foreground job
        os.killpg(proc.pid, signal.SIGINT)
    elif target == "term":  # kill <pid>, a supervisor's stop
        proc.send_signal(signal.SIGTERM)
    else:  # kill -INT <pid>
        proc.send_signal(signal.SIGINT)
    try:
        return proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def postgres_processes_under(folder: Path) -> list[tuple[int, str]]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(folder) in text and "postgres" in text:
            found.append((int(cmdline.parent.name), text))
    return found


def embedded_has_tenants(tmp: Path) -> bool:
    for pidfile in tmp.glob("agentkeel-pg-*/data/postmaster.pid"):
        try:
            port = int(pidfile.read_text().splitlines()[3])
            dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
            with psycopg.connect(dsn, connect_timeout=1) as conn:
                row = conn.execute(
                    "select to_regclass('keel.tenants') is not null"
                    " and exists (select from keel.tenants)"
                ).fetchone()
                return bool(row and row[0])
        except (OSError, ValueError, IndexError, psycopg.Error):
            return False
    return False


@pytest.mark.parametrize(
    ("target", "sigint_ignored"),
    [("group", False), ("pid", False), ("pid", True), ("term", True)],
    ids=["ctrl-c", "kill-int", "kill-int-started-in-background", "kill-term"],
)
def test_ctrl_c_on_the_embedded_default_removes_the_cluster(private_tmp, target, sigint_ignored):
    """Also when started with SIGINT ignored, as `agentkeel conformance &` in a script: the
    suite must stop at the signal, not run to its end first."""
    proc = start([], private_tmp, sigint_ignored=sigint_ignored)
    wait_for(lambda: embedded_has_tenants(private_tmp), proc, timeout=180)
    assert postgres_processes_under(private_tmp), "the embedded postmaster was not found"
    stdout, stderr = interrupt(proc, target)
    deadline = time.monotonic() + 10
    while postgres_processes_under(private_tmp) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = postgres_processes_under(private_tmp)
    for pid, _ in left:  # stop what a broken teardown leaked, then fail
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGQUIT)
    assert not left, "a postmaster of the suite kept running"
    assert not list(private_tmp.glob("agentkeel-pg-*")), "the cluster's temp folder remains"
    assert proc.returncode == ExitCode.INTERRUPTED, (stdout[-2000:], stderr[-2000:])
    assert "KeyboardInterrupt" in stdout, "the suite ran on after the signal: " + stdout[-2000:]
    messages = [line for line in stderr.splitlines() if line.startswith("agentkeel")]
    assert len(messages) == 1 and messages[0].startswith("agentkeel: interrupted"), stderr


def suite_leftovers(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        return {
            "tenants": conn.execute(
                "select count(*) from keel.tenants where name like 'agentkeel-conformance-%'"
            ).fetchone()[0],
            "workflows": conn.execute(
                "select count(*) from keel.workflows where workflow like 'akc-%'"
            ).fetchone()[0],
            "roles": conn.execute(
                "select count(*) from pg_roles where rolname like 'akc\\_%'"
            ).fetchone()[0],
        }


def test_ctrl_c_with_a_dsn_leaves_nothing_of_the_suite_in_the_database(migrated_db, private_tmp):
    proc = start(["--dsn", migrated_db], private_tmp)
    wait_for(lambda: suite_leftovers(migrated_db)["tenants"] > 0, proc, timeout=180)
    stdout, stderr = interrupt(proc, "group")
    assert suite_leftovers(migrated_db) == {"tenants": 0, "workflows": 0, "roles": 0}
    assert proc.returncode == ExitCode.INTERRUPTED, (stdout[-2000:], stderr[-2000:])
    messages = [line for line in stderr.splitlines() if line.startswith("agentkeel")]
    assert len(messages) == 1 and messages[0].startswith("agentkeel: interrupted"), stderr
