"""`agentkeel distribute`: the Citus step, generated from the catalog. Its plan is checked
here as text and as a pure function of catalog rows, on PostgreSQL; what it does on a real
cluster is tests/test_citus.py's."""

from __future__ import annotations

import dataclasses

import psycopg
import pytest
from psycopg import conninfo

from agentkeel.distribute import Layout, apply, plan, read_layout, script
from agentkeel.exitcodes import ExitCode
from conftest import run_agentkeel


def generated(dsn: str) -> str:
    result = run_agentkeel("distribute", "--dsn", dsn)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_every_table_key_and_function_has_its_step(migrated_db):
    text = generated(migrated_db)
    dbname = conninfo.conninfo_to_dict(migrated_db)["dbname"]
    assert "select create_distributed_table('keel.tenants', 'tenant_id');" in text
    for table in ("tasks", "task_events", "operations", "outbox"):
        assert (
            f"select create_distributed_table('keel.{table}', 'tenant_id',"
            " colocate_with => 'keel.tenants');"
        ) in text
    for table in ("workflows", "workflow_transitions", "settings", "redaction_rules"):
        assert f"select create_reference_table('keel.{table}');" in text
    for local in ("migration_history", "tenant_token_keys"):
        assert f"'keel.{local}'" not in text
    with psycopg.connect(migrated_db) as conn:
        fks = conn.execute(
            "select conrelid::regclass::text, conname from pg_constraint"
            " where contype = 'f' and connamespace = 'keel'::regnamespace"
        ).fetchall()
        # Delegated: p_tenant_id and granted to an application role (internal helpers that
        # take a tenant are only propagated); mint_tenant_token reads the coordinator's keys.
        functions = [
            r[0]
            for r in conn.execute(
                "select oid::regprocedure::text from pg_proc"
                " where pronamespace = 'keel'::regnamespace and 'p_tenant_id' = any(proargnames)"
                " and has_function_privilege('keel_app', oid, 'execute')"
                " and proname <> 'mint_tenant_token'"
            )
        ]
    for table, name in fks:
        drop = text.index(f"alter table {table} drop constraint {name};")
        add = text.index(f"alter table {table} add constraint {name} ")
        assert drop < text.index("create_reference_table") < add
    assert text.index("set local citus.multi_shard_modify_mode to 'sequential';") < text.index(
        " drop constraint "
    )
    assert text.index("set local citus.enable_unsafe_triggers = on;") < text.index(
        "'keel.task_events'"
    )
    assert functions
    for function in functions:
        assert (
            f"create_distributed_function('{function}'::regprocedure, 'p_tenant_id',"
            " colocate_with := 'keel.tenants', force_delegation := true);"
        ) in text
    for helper in ("keel.mint_tenant_token(uuid,interval,text)", "keel.lock_task(uuid,uuid,text)"):
        assert f"create_distributed_function('{helper}'::regprocedure);" in text
    # Depends on the coordinator's keel.migration_history: Citus refuses to propagate it.
    assert "create_distributed_function('keel.applied_migrations()'" not in text
    # The database, not the NOLOGIN group roles whose settings members do not inherit.
    assert f"alter database {dbname} set citus.propagate_set_commands = 'local';" in text
    assert "alter role keel_app set" not in text


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


# The planner is pure: catalog rows in, steps out. Each case below starts from this
# database's real catalog (read_layout) and changes only what a Citus run would have
# recorded (pg_dist_partition, pg_dist_object, role and database settings, worker keys).


@pytest.fixture
def layout(migrated_db) -> Layout:
    with psycopg.connect(migrated_db) as conn:
        return read_layout(conn)


def _done(layout: Layout) -> Layout:
    """What the catalog reads after a successful --apply on a cluster of two workers."""
    return dataclasses.replace(
        layout,
        distributed_tables=frozenset(layout.tenant_tables + layout.reference_tables),
        distributed_functions=frozenset(layout.api_functions + layout.helper_functions),
        delegated_functions=frozenset(layout.api_functions),
        installed_variants=frozenset(v.function for v in layout.variants),
        owner_can_login=False,
        database_propagates_set_local=True,
        has_context_key=True,
        keys_digest="k",
        worker_keys_digests=("k", "k"),
    )


def test_the_script_is_one_transaction_in_the_order_citus_needs(layout):
    text = script(layout)
    order = [
        "begin;",
        "set local citus.multi_shard_modify_mode to 'sequential';",
        " drop constraint ",
        "select create_reference_table(",
        "select create_distributed_table('keel.tenants', 'tenant_id');",
        " add constraint ",
        "create or replace function keel.claim_next_tasks(",
        "create or replace function keel.context_stamp()",
        "alter database ",
        "select keel.rotate_context_key();",
        "select run_command_on_workers('create table if not exists keel.context_keys",
        "'p_tenant_id', colocate_with := 'keel.tenants', force_delegation := true);",
        "select create_distributed_function('keel.set_tenant_context(uuid)'::regprocedure);",
        "revoke all on all functions in schema keel from public;",
        "commit;",
    ]
    positions = [text.index(marker) for marker in order]
    assert positions == sorted(positions), list(zip(order, positions, strict=True))
    # keel_owner never logs in; the token signing keys are never copied.
    assert "alter role keel_owner login" not in text and "tenant_token_keys" not in text


def test_an_owner_that_can_log_in_is_made_nologin(layout):
    """A cluster distributed by an earlier agentkeel gave keel_owner LOGIN: taken back."""
    text = script(dataclasses.replace(_done(layout), owner_can_login=True))
    assert "alter role keel_owner nologin;" in text


def test_token_keys_a_worker_still_holds_are_removed(layout):
    text = script(dataclasses.replace(_done(layout), workers_with_token_keys=2))
    assert "drop table if exists keel.tenant_token_keys" in text


def test_functions_a_worker_lets_public_execute_get_the_shipped_privileges_again(layout):
    text = script(dataclasses.replace(_done(layout), workers_public_functions=3))
    assert "revoke all on all functions in schema keel from public;" in text
    assert "create_distributed_function" not in text


def test_a_second_run_plans_nothing_and_says_so(layout):
    done = _done(layout)
    assert plan(done) == []
    assert "Nothing to do" in script(done)
    assert " drop constraint " not in script(done)


def test_a_function_added_after_distribution_is_propagated_without_touching_any_table(layout):
    done = _done(layout)
    later = dataclasses.replace(
        done,
        api_functions=[*done.api_functions, "keel.add_note(uuid,text)"],
        helper_functions=[*done.helper_functions, "keel.note_helper(text)"],
    )
    text = script(later)
    assert "select create_distributed_function('keel.add_note(uuid,text)'::regprocedure," in text
    assert "select create_distributed_function('keel.note_helper(text)'::regprocedure);" in text
    for absent in (" drop constraint ", "create_distributed_table", "create_reference_table"):
        assert absent not in text
    assert len(plan(later)) == 4  # sequential mode, the API function, the helper, privileges


def test_a_table_added_after_distribution_drops_and_readds_only_its_own_keys(layout):
    done = _done(layout)
    later = dataclasses.replace(
        done,
        tenant_tables=[*done.tenant_tables, "keel.notes"],
        foreign_keys=[
            *done.foreign_keys,
            (
                "keel.notes",
                "notes_task_fkey",
                "FOREIGN KEY (tenant_id, task_id) REFERENCES keel.tasks(tenant_id, task_id)",
            ),
        ],
    )
    text = script(later)
    assert text.count(" drop constraint ") == 1
    assert "alter table keel.notes drop constraint notes_task_fkey;" in text
    assert "alter table keel.notes add constraint notes_task_fkey FOREIGN KEY" in text
    assert (
        "select create_distributed_table('keel.notes', 'tenant_id',"
        " colocate_with => 'keel.tenants');" in text
    )
    assert text.count("create_distributed_table(") == 1


def test_a_new_table_that_a_distributed_table_references_brings_that_key_along(layout):
    done = _done(layout)
    later = dataclasses.replace(
        done,
        reference_tables=[*done.reference_tables, "keel.kinds"],
        foreign_keys=[
            *done.foreign_keys,
            ("keel.tasks", "tasks_kind_fkey", "FOREIGN KEY (kind) REFERENCES keel.kinds(kind)"),
        ],
    )
    text = script(later)
    assert "alter table keel.tasks drop constraint tasks_kind_fkey;" in text
    assert text.count(" drop constraint ") == 1


@pytest.mark.parametrize(
    ("workers", "copied"),
    [
        (None, True),  # Citus not installed (the printed script): always listed
        ((), False),  # no worker yet: nothing to copy
        (("same", "same"), False),
        (("same", None), True),  # a worker without the table (a node added later)
        (("same", "older"), True),  # a worker that missed a rotation
    ],
)
def test_the_context_keys_are_copied_when_a_worker_lacks_them(layout, workers, copied):
    done = dataclasses.replace(_done(layout), keys_digest="same", worker_keys_digests=workers)
    text = script(done)
    assert ("create table if not exists keel.context_keys" in text) is copied


def test_the_context_keys_copy_carries_no_key_material(migrated_db):
    """The rows are formatted on the coordinator when the step runs, never printed."""
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        conn.execute("select keel.rotate_context_key()")
        keys = conn.execute(
            "select encode(inner_key, 'hex'), encode(outer_key, 'hex') from keel.context_keys"
        ).fetchall()
    text = generated(migrated_db)
    assert keys and "run_command_on_workers(format(" in text
    for inner, outer in keys:
        assert inner[:16] not in text and outer[:16] not in text


def test_a_layout_without_a_database_is_refused(layout):
    with pytest.raises(ValueError, match="no database"):
        plan(dataclasses.replace(layout, database=""))


def test_apply_is_one_transaction_a_failing_step_leaves_every_key_in_place(migrated_db):
    """Run on PostgreSQL without Citus, --apply's runner fails at the first Citus call
    (create_reference_table), after the foreign keys were dropped: they are all back."""
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        before = conn.execute(
            "select count(*) from pg_constraint"
            " where contype = 'f' and connamespace = 'keel'::regnamespace"
        ).fetchone()
        steps = plan(read_layout(conn))
        assert any(" drop constraint " in s for step in steps for s in step.statements)
        with pytest.raises(psycopg.errors.UndefinedFunction):
            apply(conn, steps)
        after = conn.execute(
            "select count(*) from pg_constraint"
            " where contype = 'f' and connamespace = 'keel'::regnamespace"
        ).fetchone()
    assert before == after and before[0] > 0


def test_a_shard_count_is_set_for_the_tables_still_to_distribute(layout):
    text = script(layout, shard_count=8)
    assert text.index("set local citus.shard_count = 8;") < text.index(
        "select create_distributed_table('keel.tenants', 'tenant_id');"
    )
    assert "citus.shard_count" not in script(_done(layout), shard_count=8)
