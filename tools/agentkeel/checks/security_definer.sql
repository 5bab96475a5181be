-- agentkeel check: every SECURITY DEFINER function in keel pins search_path and is owned
-- by keel_owner; nothing in keel is executable by PUBLIC (G1).
select
    'security_definer' as rule,
    'G1' as guarantee,
    'error' as level,
    p.oid::regprocedure::text as object,
    'SECURITY DEFINER without a pinned search_path' as problem,
    format('ALTER FUNCTION %s SET search_path = pg_catalog, pg_temp;', p.oid::regprocedure) as remedy
from pg_catalog.pg_proc as p
inner join pg_catalog.pg_namespace as n on p.pronamespace = n.oid
where
    n.nspname = 'keel'
    and p.prosecdef
    and not exists (
        select 1 from unnest(p.proconfig) as setting
        where setting like 'search\_path=%'
    )

union all

select
    'security_definer',
    'G1',
    'error',
    p.oid::regprocedure::text,
    format('SECURITY DEFINER owned by %s, not keel_owner', pg_catalog.pg_get_userbyid(p.proowner)),
    format('ALTER FUNCTION %s OWNER TO keel_owner;', p.oid::regprocedure)
from pg_catalog.pg_proc as p
inner join pg_catalog.pg_namespace as n on p.pronamespace = n.oid
where n.nspname = 'keel' and p.prosecdef and pg_catalog.pg_get_userbyid(p.proowner) <> 'keel_owner'

union all

select
    'security_definer',
    'G1',
    'error',
    p.oid::regprocedure::text,
    'PUBLIC may execute it',
    format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC;', p.oid::regprocedure)
from pg_catalog.pg_proc as p
inner join pg_catalog.pg_namespace as n on p.pronamespace = n.oid
where
    n.nspname = 'keel'
    and (
        p.proacl is null
        or exists (
            select 1 from pg_catalog.aclexplode(p.proacl) as acl
            where acl.grantee = 0 and acl.privilege_type = 'EXECUTE'
        )
    )
order by 4, 5;
