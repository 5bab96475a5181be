"""The git questions lint asks: the newest release tag, and what changed since."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str] | None:
    git = shutil.which("git")
    if git is None:
        return None
    return subprocess.run([git, *args], cwd=root, capture_output=True, text=True, check=False)


def newest_tag(root: Path) -> str | None:
    tags = _git(root, "tag", "--list", "--sort=-creatordate")
    if tags is None or tags.returncode != 0 or not tags.stdout.strip():
        return None
    return tags.stdout.split()[0]


def changed_since(root: Path, tag: str, folder: str) -> list[tuple[str, str]]:
    """(status letter, path) of each file under folder changed since tag."""
    diff = _git(root, "diff", "--name-status", tag, "--", folder)
    if diff is None:
        return []
    rows = []
    for row in diff.stdout.splitlines():
        status, _, path = row.partition("\t")
        rows.append((status, path))
    return rows
