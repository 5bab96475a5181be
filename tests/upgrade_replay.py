"""Upgrade replay (G12): install a released version, add data, upgrade to the working tree,
and compare with a fresh install. Used by tests/test_upgrade.py and by .ci/upgrade."""

from __future__ import annotations

import io
import subprocess
import tarfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import sql

from agentkeel.client import Keel
from agentkeel.migrate import load_sources, migrate_up
from catalog import differences, snapshot

SQL_FOLDERS = ("schema", "functions", "policies")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, capture_output=True, text=True, check=True
    ).stdout


def releases(repo: Path) -> list[str]:
    """Release tags, oldest first; without one, the first commit that has schema/."""
    tags = git(repo, "tag", "--list", "v*", "--sort=creatordate").split()
    if tags:
        return tags
    first = git(repo, "log", "--format=%H", "--reverse", "--", "schema").split()
    return first[:1]


def oldest_upgradable(repo: Path, scratch: Path) -> str | None:
    """Before the first release, the oldest commit of schema/ whose versioned files are
    still unchanged now: files edited before any release cannot be upgraded from."""
    for i, ref in enumerate(git(repo, "log", "--format=%H", "--reverse", "--", "schema").split()):
        if not edited_since(export(repo, ref, scratch / f"probe-{i}"), repo):
            return ref
    return None


def export(repo: Path, ref: str, into: Path) -> Path:
    """The SQL folders as they were at ref."""
    present = [f for f in SQL_FOLDERS if git(repo, "ls-tree", "--name-only", ref, f).strip()]
    archive = subprocess.run(
        ["git", "archive", "--format=tar", ref, *present], cwd=repo, capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    for folder in SQL_FOLDERS:
        (into / folder).mkdir(exist_ok=True)
    return into


def edited_since(old: Path, new: Path) -> list[str]:
    """Versioned files of the old tree that the new tree changed or removed (drift)."""
    new_sources = {m.name: m.checksum for m in load_sources(new)}
    return [
        m.name
        for m in load_sources(old)
        if m.kind == "versioned" and new_sources.get(m.name) != m.checksum
    ]


@dataclass
class Replay:
    ref: str
    problems: list[str] = field(default_factory=list)


def replay(
    repo: Path, ref: str, old_tree: Path, new_tree: Path, upgraded_dsn: str, fresh_dsn: str
) -> Replay:
    result = Replay(ref)
    export(repo, ref, old_tree)
    tenant = uuid.uuid4()
    with psycopg.connect(upgraded_dsn, autocommit=True) as conn:
        migrate_up(conn, old_tree)
        # The old version's own SQL API, as its callers used it: today's client may rely on
        # functions the old version did not have.
        with conn.transaction():
            conn.execute(sql.SQL("set local keel.tenant_id = {}").format(sql.Literal(str(tenant))))
            bound = conn.execute("select to_regproc('keel.bind_tenant_context')").fetchone()
            if bound and bound[0] is not None:  # versions that stamp the context need it
                conn.execute("select keel.bind_tenant_context()")
            conn.execute(
                "select keel.define_workflow('upgrade-fixture', 1, 'queued',"
                ' \'[["queued", "running"]]\')'
            )
            conn.execute("select keel.create_tenant(%s, 'upgrade fixture')", (tenant,))
            row = conn.execute(
                "select task_id from keel.create_task(%s, 'upgrade-fixture', 1)", (tenant,)
            ).fetchone()
            assert row is not None
            conn.execute(
                "select keel.reserve_operation(%s, null, 'fixture-key', 'act', 'h')", (tenant,)
            )
            conn.execute(
                "select keel.transition_task(%s, %s, 1, 'running',"
                ' p_outbox => \'[{"topic": "fixture"}]\')',
                (tenant, row[0]),
            )
        migrate_up(conn, new_tree)
        keel = Keel(conn)
        with keel.transaction(tenant) as tx:
            counts = tx.execute(
                "select (select count(*) from keel.tasks), (select count(*) from keel.task_events),"
                " (select count(*) from keel.operations), (select count(*) from keel.outbox)"
            ).fetchone()
        if counts != (1, 2, 1, 1):
            result.problems.append(
                f"fixture rows after the upgrade: {counts}, expected (1, 2, 1, 1)"
            )
        upgraded = snapshot(conn)
    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        migrate_up(conn, new_tree)
        fresh = snapshot(conn)
    result.problems += differences(fresh, upgraded)
    return result
