"""The project's tests say how far they are where no terminal shows it (tests/progress_lines.py):
a real pytest run, in a subprocess, with and without xdist."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_a_progress_line_every_interval_and_at_the_end(tmp_path: Path, xdist: list[str]) -> None:
    (tmp_path / "test_three.py").write_text(
        "def test_a(): pass\ndef test_b(): assert 0\ndef test_c(): pass\n"
    )

    def run(seconds: str) -> list[str]:
        env = {**os.environ, "PYTHONPATH": str(REPO / "tests"), "CI": "true"}
        env["AGENTKEEL_TEST_PROGRESS_SECONDS"] = seconds
        pytest_cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
        result = subprocess.run(
            [*pytest_cmd, "-p", "progress_lines", "-q", *xdist, "test_three.py"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 1, result.stdout  # test_b fails
        return [line for line in result.stdout.splitlines() if line.startswith("progress: ")]

    every_test = run("0")
    assert [line.split(",")[0] for line in every_test] == [
        "progress: 1 of 3 tests",
        "progress: 2 of 3 tests",
        "progress: 3 of 3 tests",
    ]
    assert every_test[-1].startswith("progress: 3 of 3 tests, 1 failed, ")
    # A run shorter than the interval: the last line only.
    assert [line.split(",")[0] for line in run("3600")] == ["progress: 3 of 3 tests"]
