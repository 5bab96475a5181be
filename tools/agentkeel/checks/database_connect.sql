-- agentkeel check: no keel_* group role holds CONNECT on this database (G1). The group
-- roles are cluster-wide, shared by every agentkeel database on the server: CONNECT for
-- keel_app lets another installation's app logins in, trusted here as this one's; for
-- keel_owner, its migrator, as the owner. Each login of this installation gets CONNECT by
-- name (agentkeel bootstrap does). PUBLIC's CONNECT lets in every login of the server,
-- members of the keel_* groups of other installations too, unless pg_hba.conf keeps them
-- out, which this rule cannot see: a warning.
with grants as (
    select
        a.grantee,
        a.privilege_type
    from pg_catalog.pg_database as d
    cross join lateral aclexplode(coalesce(d.datacl, acldefault('d', d.datdba))) as a
    where d.datname = current_database() and a.privilege_type = 'CONNECT'
)

select
    'database_connect' as rule,
    'G1' as guarantee,
    'error' as level,
    r.rolname::text as object,
    format(
        'holds CONNECT on database %s: %s is shared by every agentkeel database on the '
        || 'server, so their logins connect here and are trusted as this installation''s',
        current_database(), r.rolname
    ) as problem,
    format(
        'REVOKE CONNECT ON DATABASE %I FROM %I; then GRANT CONNECT ON DATABASE %I TO '
        || 'each login of this installation (docs/security.md, Bootstrap)',
        current_database(), r.rolname, current_database()
    ) as remedy
from grants as g
inner join pg_catalog.pg_roles as r on g.grantee = r.oid
where
    r.rolname in (
        'keel_owner', 'keel_migrator', 'keel_app', 'keel_worker', 'keel_relay', 'keel_agent',
        'keel_auditor', 'keel_watchdog'
    )
union all
select
    'database_connect',
    'G1',
    'warning',
    'PUBLIC',
    format(
        'PUBLIC holds CONNECT on database %s: every login of the server connects, members '
        || 'of other installations'' keel_* roles too, unless pg_hba.conf keeps them out',
        current_database()
    ),
    format(
        'REVOKE CONNECT ON DATABASE %I FROM PUBLIC; then GRANT CONNECT ON DATABASE %I TO '
        || 'each login of this installation',
        current_database(), current_database()
    )
from grants as g
where g.grantee = 0
order by level, object;
