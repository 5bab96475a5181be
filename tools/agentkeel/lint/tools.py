"""The external linters: sqlfluff (every file) and squawk (schema/ only).

A linter that is not installed raises ToolMissing, and one that crashes (a non-zero exit
without output that can be read) raises ToolCrashed: neither is ever "no findings".
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from agentkeel.lint.core import Finding, SqlFile
from agentkeel.migrate import NO_TRANSACTION_MARKER as NO_TRANSACTION

INSTALL = "pip install 'agentkeel[lint]'"

# agentkeel's own advice for squawk rules whose fix depends on how agentkeel migrate runs.
SQUAWK_HINTS = {
    "require-concurrent-index-creation": (
        f"create index concurrently, in a migration whose first line is `{NO_TRANSACTION}` "
        "(agentkeel migrate then runs it one statement at a time, outside a transaction)"
    ),
    "ban-concurrent-index-creation-in-transaction": (
        f"put `{NO_TRANSACTION}` on the migration's first line: agentkeel migrate runs every "
        "other versioned file in one transaction"
    ),
    "adding-required-field": (
        "add the column nullable or with a constant default, backfill in bounded batches, "
        "then SET NOT NULL in a later migration"
    ),
    "constraint-missing-not-valid": (
        "add the constraint NOT VALID, then VALIDATE CONSTRAINT in a later migration"
    ),
}


class LintToolError(Exception):
    """An external linter could not give an answer."""

    def __init__(self, tool: str, message: str) -> None:
        super().__init__(message)
        self.tool = tool


class ToolMissing(LintToolError, FileNotFoundError):
    """sqlfluff or squawk is not installed (a FileNotFoundError too, for older callers)."""


class ToolCrashed(LintToolError):
    """sqlfluff or squawk exited non-zero without output lint can read."""


def find_tool(name: str) -> str:
    """The executable: on PATH, else beside the running interpreter (a venv's bin/ is not on
    PATH when `.venv/bin/agentkeel` runs without the venv activated)."""
    search = os.pathsep.join([os.environ.get("PATH", ""), str(Path(sys.executable).parent)])
    found = shutil.which(name, path=search)
    if found is None:
        raise ToolMissing(
            name,
            f"{name} is not installed, so `agentkeel lint` cannot run it: {INSTALL} "
            "(or pass --static-only to skip sqlfluff and squawk)",
        )
    return found


def _run(tool: str, argv: list[str], root: Path, ok: tuple[int, ...]) -> Any:
    proc = subprocess.run(argv, cwd=root, capture_output=True, text=True, check=False)
    try:
        records = json.loads(proc.stdout) if proc.stdout.strip() else None
    except json.JSONDecodeError:
        records = None
    if proc.returncode not in ok or (records is None and proc.returncode != 0):
        detail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise ToolCrashed(
            tool,
            f"{tool} failed (exit {proc.returncode}) without findings lint can read"
            + (": " + " / ".join(detail) if detail else ""),
        )
    return records or []


def _relative(path: str, root: Path) -> str:
    resolved = Path(path).resolve()
    return str(resolved.relative_to(root)) if resolved.is_relative_to(root) else path


def run_sqlfluff(paths: list[Path], root: Path) -> list[Finding]:
    dialect = [] if (root / ".sqlfluff").exists() else ["--dialect", "postgres"]
    argv = [find_tool("sqlfluff"), "lint", "--format", "json", "--nofail", *dialect]
    records = _run("sqlfluff", [*argv, *map(str, paths)], root, ok=(0,))
    findings = []
    for record in records:
        name = _relative(record["filepath"], root)
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
    targets = [f for f in files if f.name.startswith("schema/")]
    if not targets:
        return []
    squawk = find_tool("squawk")
    config = root / ".squawk.toml"
    argv = [squawk, *(["-c", str(config)] if config.exists() else []), "--reporter", "json"]
    records = _run("squawk", [*argv, *(str(f.path) for f in targets)], root, ok=(0, 1))
    outside_transaction = {
        str(f.path.resolve())
        for f in targets
        if f.text.splitlines()[:1] and f.text.splitlines()[0].strip() == NO_TRANSACTION
    }
    findings = []
    for record in records:
        rule = record["rule_name"]
        if (
            rule == "ban-concurrent-index-creation-in-transaction"
            and str(Path(record["file"]).resolve()) in outside_transaction
        ):
            continue  # agentkeel migrate runs this file outside a transaction
        hint = SQUAWK_HINTS.get(rule) or record.get("help") or ""
        findings.append(
            Finding(
                _relative(record["file"], root),
                int(record["line"]) + 1,  # squawk counts lines from 0
                f"squawk.{rule}",
                record["message"],
                hint,
            )
        )
    return findings
