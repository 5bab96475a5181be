"""The wheel works without the checkout: SQL files are inside it and the resolver finds them."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.slow


def run(cmd: list[str], cwd: Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, check=False, timeout=600, **kwargs
    )
    assert result.returncode == 0, f"{cmd}\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)],
        cwd=out,
    )
    (built,) = out.glob("agentkeel-*.whl")
    return built


def test_the_wheel_carries_every_sql_file(wheel: Path):
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder in ("schema", "functions"):
        for path in (REPO / folder).glob("*.sql"):
            assert f"agentkeel/sql/{folder}/{path.name}" in names
    assert "agentkeel_conformance/plugin.py" in names
    assert "agentkeel_conformance/pytest.ini" in names
    # The Citus variants `agentkeel distribute` installs, and the check queries.
    for path in (REPO / "tools" / "agentkeel" / "citus").glob("*.sql"):
        assert f"agentkeel/citus/{path.name}" in names


def test_an_installed_wheel_migrates_and_runs_the_suite_outside_the_checkout(
    wheel: Path, db: str, tmp_path: Path
):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    bin_dir = env_dir / "bin"
    run([str(bin_dir / "pip"), "install", "-q", str(wheel)], cwd=tmp_path)
    clean_env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "AGENTKEEL_SQL_DIR", "AGENTKEEL_DSN")
    }
    located = run(
        [
            str(bin_dir / "python"),
            "-c",
            "from agentkeel.sql_files import sql_root; print(sql_root())",
        ],
        cwd=tmp_path,
        env=clean_env,
    )
    assert str(env_dir) in located.stdout and str(REPO) not in located.stdout
    run([str(bin_dir / "agentkeel"), "migrate", "up", "--dsn", db], cwd=tmp_path, env=clean_env)
    run(
        [str(bin_dir / "agentkeel"), "migrate", "validate", "--dsn", db],
        cwd=tmp_path,
        env=clean_env,
    )
    suite = run(
        [str(bin_dir / "agentkeel"), "conformance", "--dsn", db, "-q", "-k", "contiguous"],
        cwd=tmp_path,
        env=clean_env,
    )
    assert "1 passed" in suite.stdout
