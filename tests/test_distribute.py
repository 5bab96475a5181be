"""`agentkeel distribute`: the Citus step, generated from the catalog (checked as text:
Citus cannot run here)."""

from __future__ import annotations

import psycopg

from agentkeel.exitcodes import ExitCode
from conftest import run_agentkeel


def generated(dsn: str) -> str:
    result = run_agentkeel("distribute", "--dsn", dsn)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_every_table_key_and_function_has_its_step(migrated_db):
    text = generated(migrated_db)
    assert "select create_distributed_table('keel.tenants', 'tenant_id');" in text
    for table in ("tasks", "task_events", "operations", "outbox"):
        assert (
            f"select create_distributed_table('keel.{table}', 'tenant_id',"
            " colocate_with => 'keel.tenants');"
        ) in text
    for table in ("workflows", "workflow_transitions", "settings", "redaction_rules"):
        assert f"select create_reference_table('keel.{table}');" in text
    for local in ("migration_history", "tenant_token_keys"):
        assert f"'keel.{local}'" not in text and f"--   keel.{local}" in text
    with psycopg.connect(migrated_db) as conn:
        fks = conn.execute(
            "select conrelid::regclass::text, conname from pg_constraint"
            " where contype = 'f' and connamespace = 'keel'::regnamespace"
        ).fetchall()
        functions = [
            r[0]
            for r in conn.execute(
                "select oid::regprocedure::text from pg_proc"
                " where pronamespace = 'keel'::regnamespace and 'p_tenant_id' = any(proargnames)"
            )
        ]
    for table, name in fks:
        drop = text.index(f"alter table {table} drop constraint {name};")
        add = text.index(f"alter table {table} add constraint {name} ")
        assert drop < text.index("create_reference_table") < add
    assert text.index("set citus.multi_shard_modify_mode to 'sequential';") < text.index(
        " add constraint "
    )
    assert text.index("set citus.enable_unsafe_triggers = on;") < text.index("'keel.task_events'")
    for function in functions:
        assert f"create_distributed_function('{function}'::regprocedure, 'p_tenant_id'" in text
    for role in ("keel_app", "keel_worker", "keel_agent"):
        assert f"alter role {role} set citus.propagate_set_commands = 'local';" in text


def test_a_new_table_and_function_cannot_be_forgotten(migrated_db):
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        conn.execute(
            "create table keel.notes (tenant_id uuid not null, note_id uuid not null,"
            " constraint notes_pkey primary key (tenant_id, note_id),"
            " constraint notes_tenant_fkey foreign key (tenant_id) references keel.tenants)"
        )
        conn.execute(
            "create function keel.add_note(p_tenant_id uuid) returns void language plpgsql"
            " as 'begin end'"
        )
    text = generated(migrated_db)
    assert (
        "create_distributed_table('keel.notes', 'tenant_id', colocate_with => 'keel.tenants')"
        in text
    )
    assert "alter table keel.notes drop constraint notes_tenant_fkey;" in text
    assert "create_distributed_function('keel.add_note(uuid)'::regprocedure" in text


def test_apply_without_citus_is_refused_and_runs_nothing(migrated_db):
    result = run_agentkeel("distribute", "--dsn", migrated_db, "--apply")
    assert result.returncode == ExitCode.TOOL_MISSING
    assert "citus extension is not installed" in result.stderr
    with psycopg.connect(migrated_db) as conn:
        count = conn.execute(
            "select count(*) from pg_constraint"
            " where contype = 'f' and connamespace = 'keel'::regnamespace"
        ).fetchone()[0]
    assert count > 0  # no foreign key was dropped
