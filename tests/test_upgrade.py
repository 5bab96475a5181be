"""G12: upgrading from every released version gives the catalog of a fresh install, keeps
the data, and passes the core suite."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, run_agentkeel
from upgrade_replay import edited_since, export, oldest_upgradable, releases, replay

pytestmark = pytest.mark.slow


def test_upgrading_from_each_release_matches_a_fresh_install(make_db, tmp_path):
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: no released versions to replay")
    refs = releases(REPO)
    assert refs, "no release tag and no commit of schema/"
    if not refs[0].startswith("v"):
        # No release yet: start from the oldest commit whose migrations were not edited since.
        start = oldest_upgradable(REPO, tmp_path)
        assert start is not None
        refs = [start]
    for ref in refs:
        old = export(REPO, ref, tmp_path / f"old-{ref[:12]}")
        drifted = edited_since(old, REPO)
        assert not drifted, f"released migrations edited since {ref}: {drifted}"
        upgraded = make_db()
        result = replay(REPO, ref, tmp_path / f"tree-{ref[:12]}", REPO, upgraded, make_db())
        assert not result.problems, result.problems
        suite = run_agentkeel("conformance", "--dsn", upgraded, "-q", "-k", "g2 or g3 or g5")
        assert suite.returncode == 0, suite.stdout[-3000:]


def test_the_replay_catches_an_upgrade_that_differs_from_a_fresh_install(make_db, tmp_path):
    """A synthetic repository: release v1, then a new migration at HEAD; the replay passes.
    Then HEAD forgets a comment the release had created: the replay reports it."""
    repo = tmp_path / "repo"
    for folder in ("schema", "functions", "policies"):
        shutil.copytree(REPO / folder, repo / folder)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "."], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "v1"], cwd=repo, check=True)
    subprocess.run([*git, "tag", "v1"], cwd=repo, check=True)
    (repo / "schema" / "0099_task_labels.sql").write_text(
        "alter table keel.tasks add column label text;\n"
        "comment on column keel.tasks.label is 'A label.';\n"
    )
    assert releases(repo) == ["v1"]
    clean = replay(repo, "v1", tmp_path / "old1", repo, make_db(), make_db())
    assert clean.problems == []

    # A repeatable file that the old version ran and HEAD no longer ships leaves an object
    # behind in upgraded databases only: exactly the drift this test exists to catch.
    (repo / "functions" / "lock_task.sql").unlink()
    drift = replay(repo, "v1", tmp_path / "old2", repo, make_db(), make_db())
    assert any("lock_task" in p and "only in the second" in p for p in drift.problems), (
        drift.problems
    )


def test_the_first_schema_commit_is_used_until_a_release_is_tagged(tmp_path):
    repo = tmp_path / "repo"
    (repo / "schema").mkdir(parents=True)
    (repo / "schema" / "0001_a.sql").write_text("select 1;\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "."], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "first"], cwd=repo, check=True)
    first = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True
    ).stdout.strip()
    assert releases(Path(repo)) == [first]
