"""The external linters: sqlfluff (every file) and squawk (schema/ only)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from agentkeel.lint.core import Finding, SqlFile


def run_sqlfluff(paths: list[Path], root: Path) -> list[Finding]:
    dialect = [] if (root / ".sqlfluff").exists() else ["--dialect", "postgres"]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sqlfluff",
            "lint",
            "--format",
            "json",
            "--nofail",
            *dialect,
            *map(str, paths),
        ],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    findings = []
    for record in json.loads(proc.stdout or "[]"):
        name = (
            str(Path(record["filepath"]).resolve().relative_to(root))
            if Path(record["filepath"]).resolve().is_relative_to(root)
            else record["filepath"]
        )
        for v in record.get("violations", []):
            findings.append(
                Finding(
                    name,
                    int(v.get("start_line_no") or 1),
                    f"sqlfluff.{v['code']}",
                    v["description"],
                )
            )
    return findings


def run_squawk(files: list[SqlFile], root: Path) -> list[Finding]:
    squawk = shutil.which("squawk") or str(Path(sys.executable).parent / "squawk")
    targets = [str(f.path) for f in files if f.name.startswith("schema/")]
    if not targets:
        return []
    if not Path(squawk).exists():
        raise FileNotFoundError("squawk is not installed: pip install 'agentkeel[lint]'")
    config = root / ".squawk.toml"
    proc = subprocess.run(
        [squawk, *(["-c", str(config)] if config.exists() else []), "--reporter", "json", *targets],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    findings = []
    for record in json.loads(proc.stdout or "[]"):
        path = Path(record["file"])
        name = (
            str(path.resolve().relative_to(root))
            if path.resolve().is_relative_to(root)
            else str(path)
        )
        findings.append(
            Finding(name, int(record["line"]), f"squawk.{record['rule_name']}", record["message"])
        )
    return findings
