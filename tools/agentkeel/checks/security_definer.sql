-- agentkeel check: every SECURITY DEFINER function in keel pins search_path and is owned
-- by keel_owner; nothing in keel is executable by PUBLIC (G1). A function that does not pin
-- it runs in its caller's search_path: only an internal helper may, one that no role but
-- its owner may execute (so it runs inside the SECURITY DEFINER functions, in their pinned
-- search_path), that is not a trigger function (a trigger runs whoever writes), or a
-- SQL function with a standard body (its names are bound when it is created).
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

union all

select
    'security_definer',
    'G1',
    'error',
    p.oid::regprocedure::text,
    case
        when p.prorettype = 'pg_catalog.trigger'::pg_catalog.regtype
            then 'a trigger function without a pinned search_path'
        else 'runs in its caller''s search_path, and a role other than its owner may execute it'
    end,
    format('ALTER FUNCTION %s SET search_path = pg_catalog, pg_temp;', p.oid::regprocedure)
from pg_catalog.pg_proc as p
inner join pg_catalog.pg_namespace as n on p.pronamespace = n.oid
where
    n.nspname = 'keel'
    and not p.prosecdef
    and p.prosqlbody is null
    and not exists (
        select 1 from unnest(p.proconfig) as setting
        where setting like 'search\_path=%'
    )
    and (
        p.prorettype = 'pg_catalog.trigger'::pg_catalog.regtype
        or p.proacl is null
        or exists (
            select 1 from pg_catalog.aclexplode(p.proacl) as acl
            where acl.grantee <> p.proowner and acl.privilege_type = 'EXECUTE'
        )
    )
order by 4, 5;
