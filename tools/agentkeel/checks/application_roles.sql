-- agentkeel check: no application role is a superuser, bypasses RLS or owns a keel object;
-- no login can use both a signed agent context and a trusted plain one (G1).
with app_roles as (
    select
        r.oid,
        r.rolname
    from pg_catalog.pg_roles as r
    where
        r.rolname in (
            'keel_app', 'keel_worker', 'keel_relay', 'keel_agent', 'keel_auditor', 'keel_watchdog'
        )
        or exists (
            select 1
            from pg_catalog.pg_auth_members as m
            inner join pg_catalog.pg_roles as g on m.roleid = g.oid
            where
                m.member = r.oid
                and g.rolname in (
                    'keel_app', 'keel_worker', 'keel_relay', 'keel_agent', 'keel_auditor',
                    'keel_watchdog'
                )
        )
),

keel_objects as (
    select
        c.oid::regclass::text as name,
        c.relowner as owner
    from pg_catalog.pg_class as c
    inner join pg_catalog.pg_namespace as n on c.relnamespace = n.oid
    where n.nspname = 'keel' and c.relkind in ('r', 'p', 'v', 'm', 'S', 'f')
    union all
    select
        p.oid::regprocedure::text,
        p.proowner
    from pg_catalog.pg_proc as p
    inner join pg_catalog.pg_namespace as n on p.pronamespace = n.oid
    where n.nspname = 'keel'
    union all
    select
        n.nspname::text,
        n.nspowner
    from pg_catalog.pg_namespace as n
    where n.nspname = 'keel'
)

select
    'application_roles' as rule,
    'G1' as guarantee,
    'error' as level,
    a.rolname::text as object,
    'an application role is a superuser' as problem,
    format('ALTER ROLE %I NOSUPERUSER;', a.rolname) as remedy
from app_roles as a
inner join pg_catalog.pg_roles as r on a.oid = r.oid
where r.rolsuper

union all

select
    'application_roles',
    'G1',
    'error',
    a.rolname::text,
    'an application role has BYPASSRLS',
    format('ALTER ROLE %I NOBYPASSRLS;', a.rolname)
from app_roles as a
inner join pg_catalog.pg_roles as r on a.oid = r.oid
where r.rolbypassrls

union all

select
    'application_roles',
    'G1',
    'error',
    o.name,
    format('owned by %s, not keel_owner', pg_catalog.pg_get_userbyid(o.owner)),
    'Run `agentkeel migrate up` (policies/02_ownership.sql hands every object to keel_owner).'
from keel_objects as o
where
    o.owner is distinct from (
        select r.oid from pg_catalog.pg_roles as r
        where r.rolname = 'keel_owner'
    )

union all

select
    'application_roles',
    'G1',
    'error',
    r.rolname::text,
    'a member of keel_agent is also a member of a trusted role, so it can skip the signed token',
    format('Use separate logins for agents and server code: REVOKE keel_app, keel_worker FROM %I;', r.rolname)
from pg_catalog.pg_roles as r
where
    r.rolname not like 'keel\_%'
    and pg_catalog.pg_has_role(r.oid, 'keel_agent', 'member')
    and not r.rolsuper
    and (
        pg_catalog.pg_has_role(r.oid, 'keel_app', 'member')
        or pg_catalog.pg_has_role(r.oid, 'keel_worker', 'member')
        or pg_catalog.pg_has_role(r.oid, 'keel_owner', 'member')
    )
order by 4, 5;
