-- agentkeel check: every tenant table (keel.tenant_tables(): a tenant_id column) has
-- row-level security enabled and forced, and a tenant_isolation policy on
-- keel.current_tenant() (G1).
-- Returns one row per finding: rule, guarantee, level, object, problem, remedy.
select
    'rls_forced' as rule,
    'G1' as guarantee,
    'error' as level,
    c.oid::regclass::text as object,
    problem.text as problem,
    'Run `agentkeel migrate up`: policies/04_row_level_security.sql enables, forces and creates the policy.' as remedy
from keel.tenant_tables() as t (oid)
inner join pg_catalog.pg_class as c on t.oid = c.oid
cross join
    lateral (
        select 'row-level security is not enabled' as text
        where not c.relrowsecurity
        union all
        select 'row-level security is not forced (the table owner bypasses it)'
        where not c.relforcerowsecurity
        union all
        select 'no policy restricts it to tenant_id = keel.current_tenant() for every command'
        where not exists (
            select 1
            from pg_catalog.pg_policy as p
            where
                p.polrelid = c.oid
                and p.polcmd = '*'
                and p.polpermissive
                and pg_catalog.pg_get_expr(p.polqual, p.polrelid) = '(tenant_id = keel.current_tenant())'
                and pg_catalog.pg_get_expr(p.polwithcheck, p.polrelid) = '(tenant_id = keel.current_tenant())'
        )
    ) as problem
order by 4, 5;
