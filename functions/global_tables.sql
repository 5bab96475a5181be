-- The one list of keel tables that are not tenant-owned (G1). Every other keel table has
-- tenant_id uuid not null in every key. `agentkeel lint` reads the names from this file
-- and `agentkeel check` compares them with the catalog, so neither keeps a copy.
create or replace function keel.global_tables()
returns setof text
language sql
immutable
parallel safe
set search_path = pg_catalog, pg_temp
as $$
    select t.name
    from (
        values
        ('keel.workflows'),
        ('keel.workflow_transitions'),
        ('keel.settings'),
        ('keel.redaction_rules'),
        ('keel.tenant_token_keys'),
        ('keel.migration_history')
    ) as t (name)
$$;

comment on function keel.global_tables() is
'The schema-qualified names of the keel tables that are global, not tenant-owned: workflow definitions, operator settings, the redaction deny-list, token signing keys and the migrator''s history. Every other keel table is a tenant table (tenant_id uuid not null in every key, row-level security forced).';
