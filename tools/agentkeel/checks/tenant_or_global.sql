-- agentkeel check: every table in keel is either a tenant table (keel.tenant_tables(); the
-- rules rls_forced and tenant_keys hold it to RLS and tenant keys) or declared global in
-- keel.global_tables() (functions/global_tables.sql), never neither nor both (G1).
with tables as (
    select
        c.oid,
        format('%I.%I', n.nspname, c.relname) as name,
        c.oid in (select t.oid from keel.tenant_tables() as t (oid)) as has_tenant_id
    from pg_catalog.pg_class as c
    inner join pg_catalog.pg_namespace as n on c.relnamespace = n.oid
    where n.nspname = 'keel' and c.relkind in ('r', 'p', 'f') and not c.relispartition
),

declared as (
    select g.table_name
    from keel.global_tables() as g
)

select
    'tenant_or_global' as rule,
    'G1' as guarantee,
    'error' as level,
    t.name as object,
    'neither a tenant table (a table with tenant_id) nor declared global' as problem,
    'Add tenant_id uuid not null (first in every key) in a new migration, or declare the table in functions/global_tables.sql.' as remedy
from tables as t
where not t.has_tenant_id and t.name not in (select d.table_name from declared as d)

union all

select
    'tenant_or_global',
    'G1',
    'error',
    t.name,
    'declared global in keel.global_tables() but it has a tenant_id column',
    'A table with tenant_id is a tenant table: remove it from functions/global_tables.sql.'
from tables as t
where t.has_tenant_id and t.name in (select d.table_name from declared as d)
order by 4, 5;
