-- Tenancy (G1): the one definition of a tenant table, read from the catalog so that a
-- new one cannot be forgotten: every table (and partition) in keel with a tenant_id
-- column. policies/04_row_level_security.sql forces RLS on each; `agentkeel check`
-- (rls_forced, tenant_keys, tenant_or_global), `agentkeel distribute` and the
-- conformance suite read the same list.
create or replace function keel.tenant_tables()
returns setof regclass
language sql
stable
parallel safe
set search_path = pg_catalog, pg_temp
as $$
    select c.oid::regclass
    from pg_catalog.pg_class as c
    inner join pg_catalog.pg_namespace as n on c.relnamespace = n.oid
    inner join pg_catalog.pg_attribute as a
        on c.oid = a.attrelid and a.attname = 'tenant_id' and not a.attisdropped
    where n.nspname = 'keel' and c.relkind in ('r', 'p')
    order by c.oid::regclass::text
$$;

comment on function keel.tenant_tables() is
'The tenant tables: every table and partition in schema keel with a tenant_id column, by regclass, in name order. Row-level security is forced on each (policies/04_row_level_security.sql); agentkeel check, agentkeel distribute and the conformance suite read this list. Every other keel table is declared in keel.global_tables().';
