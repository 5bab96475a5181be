"""G12 Safe migrations, as seen from the database under test: its migration history
matches the migration files of this agentkeel, with nothing pending, changed or unknown."""

from __future__ import annotations

import psycopg
import pytest

from agentkeel.migrate import State, plan_for
from agentkeel.sql_files import sql_root

pytestmark = [pytest.mark.guarantee("G12"), pytest.mark.read_only]


def test_the_history_matches_the_shipped_migrations(keel_dsn):
    """A changed checksum fails it (tests/test_conformance_cli.py, the drift test).
    No mutation: it compares files with the history; a function edit touches neither."""
    with psycopg.connect(keel_dsn, autocommit=True) as conn:
        plan = plan_for(conn, sql_root())
    assert not plan.problems, plan.problems
    pending = [e.name for e in plan.entries if e.state is not State.APPLIED]
    assert not pending, f"not applied (or changed since): {pending}; run `agentkeel migrate up`"


def test_every_applied_file_is_recorded_with_a_sha256(keel_dsn):
    """No mutation: the history's rows are the migrator's (Python), not shipped SQL."""
    with psycopg.connect(keel_dsn, autocommit=True) as conn:
        rows = conn.execute("select name, checksum from keel.applied_migrations()").fetchall()
    assert rows
    assert all(len(checksum) == 64 and int(checksum, 16) >= 0 for _, checksum in rows)
