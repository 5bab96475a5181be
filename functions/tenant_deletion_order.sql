-- Tenant deletion (G10): the order in which keel.delete_tenant empties the tenant tables,
-- read from the catalog (keel.tenant_tables and their foreign keys), so that a table
-- added later is deleted too without anyone listing it. A table comes before every table
-- it references (children first): a row is removed only once nothing refers to it, so no
-- delete cascades further than its batch. keel.tenants itself is last and not listed: it
-- goes in the deletion's final step. Partitions are not listed (their parent is).
-- key_columns is the primary key, which the batched delete names its rows by.
-- agentkeel:requires functions/tenant_tables.sql
create or replace function keel.tenant_deletion_order()
returns table (relation regclass, key_columns text)
language sql
stable
parallel safe
set search_path = pg_catalog, pg_temp
as $$
    with recursive tables as (
        select t.oid
        from keel.tenant_tables() as t (oid)
        inner join pg_catalog.pg_class as c on t.oid = c.oid
        where not c.relispartition and t.oid <> 'keel.tenants'::regclass
    ),

    edges as (
        select distinct
            k.conrelid as child,
            k.confrelid as parent
        from pg_catalog.pg_constraint as k
        inner join tables as c on k.conrelid = c.oid
        inner join tables as p on k.confrelid = p.oid
        where k.contype = 'f' and k.conrelid <> k.confrelid
    ),

    -- depth: the longest chain of tables below a table (0 for one nothing refers to).
    depths (oid, depth) as (
        select tables.oid, 0 from tables
        union all
        select e.parent, d.depth + 1
        from depths as d
        inner join edges as e on d.oid = e.child
        where d.depth < 64
    )

    select
        d.oid::regclass,
        (
            select string_agg(quote_ident(a.attname), ', ' order by array_position(k.conkey, a.attnum))
            from pg_catalog.pg_constraint as k
            inner join pg_catalog.pg_attribute as a
                on k.conrelid = a.attrelid and a.attnum = any(k.conkey)
            where k.conrelid = d.oid and k.contype = 'p'
        )
    from depths as d
    group by d.oid
    -- The outbox first among its peers: a tenant's pending messages go in the first steps.
    order by max(d.depth), d.oid <> 'keel.outbox'::regclass, d.oid::regclass::text
$$;

comment on function keel.tenant_deletion_order() is
'The tenant tables keel.delete_tenant empties, in order (children before the tables they reference), with each one''s primary key columns; keel.tenants is not listed (it is removed last). Read from the catalog, so a new tenant table is covered without being named; agentkeel check (rule tenant_deletion) fails when one cannot be deleted this way.';
