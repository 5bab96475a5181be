"""The hot API functions keep reading through their indexes when a plan they cached was
made while a table was nearly empty, and the table then grew (before autovacuum's ANALYZE
replaces the plan). `agentkeel bench --workload reserve` fell from 2,500 to 800 calls/s in
20 s that way."""

from __future__ import annotations

import psycopg

from agentkeel.workloads import bench_world

RESERVE = "select outcome from keel.reserve_operation(%s, null, %s, 'test', 'h')"
SCANS = (
    "select seq_scan, idx_scan from pg_stat_xact_user_tables"
    " where relid = 'keel.operations'::regclass"
)


def test_a_replayed_key_is_read_through_its_index_after_the_table_grew(migrated_db):
    with bench_world(migrated_db) as world, psycopg.connect(migrated_db, autocommit=True) as owner:
        owner.execute("alter table keel.operations set (autovacuum_enabled = off)")
        owner.execute("vacuum analyze keel.operations")  # empty, and the planner knows it
        with psycopg.connect(world.app_dsn, autocommit=True) as app:
            # Reserve and replay while the table holds a few rows: the replay's lookup is
            # planned now, and cached for the session.
            for i in range(12):
                assert app.execute(RESERVE, (world.tenant, f"early-{i}")).fetchone() == (
                    "reserved",
                )
                assert app.execute(RESERVE, (world.tenant, f"early-{i}")).fetchone() == (
                    "in_progress",
                )
            with owner.transaction():
                owner.execute(
                    "select set_config('keel.tenant_id', %s, true), keel.bind_tenant_context()",
                    (str(world.tenant),),
                )
                owner.execute(
                    "insert into keel.operations (tenant_id, idempotency_key, action,"
                    " input_hash, state, attempts, expires_at)"
                    " select %s, 'bulk-' || g, 'test', 'h', 'reserved', 1, now() + interval '1 day'"
                    " from generate_series(1, 50000) as g",
                    (world.tenant,),
                )
            with app.transaction():
                for i in range(12):
                    assert app.execute(RESERVE, (world.tenant, f"early-{i}")).fetchone() == (
                        "in_progress",
                    )
                row = app.execute(SCANS).fetchone()
        owner.execute("alter table keel.operations reset (autovacuum_enabled)")
    assert row is not None
    seq_scans, index_scans = row
    assert (seq_scans, index_scans >= 12) == (0, True), row
