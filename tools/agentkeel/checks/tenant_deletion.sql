-- agentkeel check: every tenant table can be emptied by keel.delete_tenant (G10). It has
-- a primary key (a deletion step names its rows by it), a foreign key from tenant_id to
-- keel.tenants on delete cascade (the final step removes the tenant's row, and with it
-- whatever a writer still open had added), and no cycle of foreign keys through it
-- (keel.tenant_deletion_order empties children before parents).
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

reach (start_oid, oid, hops) as (
    select
        e.child,
        e.parent,
        1
    from edges as e
    union all
    select
        r.start_oid,
        e.parent,
        r.hops + 1
    from reach as r
    inner join edges as e on r.oid = e.child
    where r.hops < 64 and r.oid <> r.start_oid
)

select
    'tenant_deletion' as rule,
    'G10' as guarantee,
    'error' as level,
    t.oid::regclass::text as object,
    'the tenant table has no primary key' as problem,
    'Add a primary key (tenant_id, ...): keel.delete_tenant removes rows by it.' as remedy
from tables as t
where
    not exists (
        select 1 from pg_catalog.pg_constraint as k
        where k.conrelid = t.oid and k.contype = 'p'
    )

union all

select
    'tenant_deletion',
    'G10',
    'error',
    t.oid::regclass::text,
    'no foreign key from tenant_id to keel.tenants on delete cascade',
    'Add foreign key (tenant_id) references keel.tenants (tenant_id) on delete cascade.'
from tables as t
where
    not exists (
        select 1
        from pg_catalog.pg_constraint as k
        inner join pg_catalog.pg_attribute as a
            on k.conrelid = a.attrelid and a.attnum = k.conkey[1] and a.attname = 'tenant_id'
        where
            k.conrelid = t.oid
            and k.contype = 'f'
            and k.confrelid = 'keel.tenants'::regclass
            and cardinality(k.conkey) = 1
            and k.confdeltype = 'c'
    )

union all

select distinct
    'tenant_deletion',
    'G10',
    'error',
    r.start_oid::regclass::text,
    'the table is part of a cycle of foreign keys between tenant tables',
    'Break the cycle: keel.delete_tenant empties tables that refer to others first.'
from reach as r
where r.oid = r.start_oid
order by 4, 5;
