"""released_migration: a versioned migration is never edited once released."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from agentkeel.lint import git
from agentkeel.lint.core import Finding


def check_released(root: Path) -> Iterator[Finding]:
    """A versioned migration changed or removed since the newest release tag."""
    tag = git.newest_tag(root)
    if tag is None:
        return
    for status, path in git.changed_since(root, tag, "schema/"):
        if status[:1] in ("M", "D", "R"):
            yield Finding(
                path,
                1,
                "released_migration",
                f"released in {tag} and {'edited' if status[0] == 'M' else 'removed'} "
                "since: add a new migration instead",
            )
