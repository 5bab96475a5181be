-- agentkeel check: on tables with tenant_id, every primary key, unique constraint,
-- unique index and foreign key includes tenant_id; a foreign key to another tenant table
-- pairs tenant_id with tenant_id (G1: a cross-tenant reference is impossible).
with tenant_tables as (
    select
        t.oid,
        a.attnum as tenant_attnum
    from keel.tenant_tables() as t (oid)
    inner join pg_catalog.pg_attribute as a on t.oid = a.attrelid and a.attname = 'tenant_id'
)

select
    'tenant_keys' as rule,
    'G1' as guarantee,
    'error' as level,
    t.oid::regclass::text || '.' || k.conname as object,
    case k.contype
        when 'p' then 'the primary key does not include tenant_id'
        when 'u' then 'the unique constraint does not include tenant_id'
    end as problem,
    'Add tenant_id as the first column of the key.' as remedy
from tenant_tables as t
inner join pg_catalog.pg_constraint as k on t.oid = k.conrelid
where k.contype in ('p', 'u') and not t.tenant_attnum = any(k.conkey)

union all

select
    'tenant_keys',
    'G1',
    'error',
    t.oid::regclass::text || '.' || i.indexrelid::regclass::text,
    'the unique index does not include tenant_id',
    'Add tenant_id as the first column of the index.'
from tenant_tables as t
inner join pg_catalog.pg_index as i on t.oid = i.indrelid
where
    i.indisunique
    and not t.tenant_attnum = any(i.indkey::int2[])
    and not exists (
        select 1 from pg_catalog.pg_constraint as k
        where k.conindid = i.indexrelid
    )

union all

select
    'tenant_keys',
    'G1',
    'error',
    t.oid::regclass::text || '.' || k.conname,
    case
        when not t.tenant_attnum = any(k.conkey)
            then 'the foreign key does not include tenant_id'
        else 'the foreign key does not pair tenant_id with the referenced tenant_id'
    end,
    'Make the foreign key composite: (tenant_id, ...) references the target''s (tenant_id, ...).'
from tenant_tables as t
inner join pg_catalog.pg_constraint as k on t.oid = k.conrelid and k.contype = 'f'
left join tenant_tables as target on k.confrelid = target.oid
where
    target.oid is not null
    and (
        not t.tenant_attnum = any(k.conkey)
        or k.confkey[array_position(k.conkey, t.tenant_attnum)] is distinct from target.tenant_attnum
    )
order by 4, 5;
