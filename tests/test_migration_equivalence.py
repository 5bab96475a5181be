"""G12: however a database got its schema, its catalog is the same."""

from __future__ import annotations

import psycopg

from agentkeel.migrate import migrate_up
from agentkeel.sql_files import sql_root
from catalog import differences, snapshot


def test_reapplying_every_repeatable_file_changes_nothing(make_db):
    once, twice = make_db(), make_db()
    with psycopg.connect(once, autocommit=True) as conn:
        migrate_up(conn, sql_root())
        expected = snapshot(conn)
    with psycopg.connect(twice, autocommit=True) as conn:
        migrate_up(conn, sql_root())
        conn.execute("delete from keel.migration_history where kind = 'repeatable'")
        assert len(migrate_up(conn, sql_root())) > 0  # every function and policy file again
        actual = snapshot(conn)
    assert differences(expected, actual) == []


def test_the_snapshot_sees_a_change(migrated_db):
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        before = snapshot(conn)
        conn.execute("alter table keel.tasks no force row level security")
        conn.execute("comment on table keel.outbox is 'changed'")
        after = snapshot(conn)
    found = "\n".join(differences(before, after))
    assert "tables: only in the first: ('tasks'" in found
    assert "comments: only in the second:" in found and "changed" in found
