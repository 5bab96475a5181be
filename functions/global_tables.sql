-- Tenancy (G1): the one declaration of the keel tables that are not tenant tables.
-- Every other table in keel is a tenant table: tenant_id in every key, RLS forced.
-- `agentkeel check` (tools/agentkeel/checks/tenant_or_global.sql) calls this function;
-- `agentkeel lint` reads the values list below from this file's text, so it stays a
-- plain list of string literals: (table, placement).
-- placement: 'reference', a copy on every Citus node; 'local', a plain per-node table
-- that is never distributed.
create or replace function keel.global_tables()
returns table (table_name text, placement text)
language sql
immutable
parallel safe
set search_path = pg_catalog, pg_temp
as $$
    values
    ('keel.context_keys', 'local'),
    ('keel.migration_history', 'local'),
    ('keel.outbox_topics', 'reference'),
    ('keel.redaction_rules', 'reference'),
    ('keel.settings', 'reference'),
    ('keel.task_event_tombstones', 'local'),
    ('keel.tenant_deletions', 'reference'),
    ('keel.tenant_token_keys', 'local'),
    ('keel.workflow_states', 'reference'),
    ('keel.workflow_transitions', 'reference'),
    ('keel.workflows', 'reference')
$$;

comment on function keel.global_tables() is
'The keel tables that are declared global (not owned by a tenant), by qualified name, with their placement: reference (a copy on every Citus node) or local (per node, never distributed). A keel table that has no tenant_id and is not listed here fails agentkeel check (rule tenant_or_global).';
