-- agentkeel check: no role but keel_owner may UPDATE, DELETE or TRUNCATE task events,
-- and the append-only trigger is installed and enabled (G4).
select
    'events_append_only' as rule,
    'G4' as guarantee,
    'error' as level,
    'keel.task_events' as object,
    format('%s may %s events', coalesce(r.rolname, 'PUBLIC'), acl.privilege_type) as problem,
    format(
        'REVOKE %s ON keel.task_events FROM %s;', acl.privilege_type, coalesce(quote_ident(r.rolname), 'PUBLIC')
    ) as remedy
from pg_catalog.pg_class as c
cross join lateral pg_catalog.aclexplode(c.relacl) as acl
left join pg_catalog.pg_roles as r on acl.grantee = r.oid
where
    c.oid = to_regclass('keel.task_events')
    and acl.privilege_type in ('UPDATE', 'DELETE', 'TRUNCATE')
    and acl.grantee <> c.relowner

union all

select
    'events_append_only',
    'G4',
    'error',
    'keel.task_events',
    'the append-only trigger is missing or disabled',
    'Run `agentkeel migrate up` (policies/05_append_only.sql), or ALTER TABLE keel.task_events ENABLE TRIGGER task_events_append_only;'
where
    to_regclass('keel.task_events') is not null
    and not exists (
        select 1 from pg_catalog.pg_trigger as t
        where
            t.tgrelid = to_regclass('keel.task_events')
            and t.tgname = 'task_events_append_only'
            and t.tgenabled in ('O', 'A')
    )
order by 4, 5;
