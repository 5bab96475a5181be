"""Issue 20 item 9: the suite's failure reports never show a temporary login's password
(its relay subprocesses printed their DSN, password included, in every traceback)."""

from __future__ import annotations

import subprocess
import sys

from agentkeel_conformance.fixtures import LoginRole
from agentkeel_conformance.harness import dsn_env

SECRET = "s3cret-not-for-reports"


def test_a_login_role_is_reported_without_its_dsn():
    role = LoginRole("akc_relay_x", "keel_relay", f"user=akc_relay_x password={SECRET}")
    assert SECRET not in repr(role) and "akc_relay_x" in repr(role)


def test_a_subprocess_gets_its_dsn_from_the_environment(tmp_path):
    """The suite's relay runs as the real CLI with dsn_env: one that cannot connect fails,
    and what an assertion on it prints (its arguments, its stderr) names no password."""
    dsn = f"host=127.0.0.1 port=1 user=akc_relay_x password={SECRET} connect_timeout=2"
    command = [sys.executable, "-m", "agentkeel.cli", "relay", "--once"]
    command += ["--sink", f"file:{tmp_path / 'sink.jsonl'}"]
    result = subprocess.run(
        command, env=dsn_env(dsn), capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 6, result.stderr  # cannot connect, from $AGENTKEEL_DSN
    assert SECRET not in repr(result.args) and SECRET not in result.stderr
