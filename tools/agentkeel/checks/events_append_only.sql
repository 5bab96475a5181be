-- agentkeel check: on every append-only table (keel.task_events, and any keel table a
-- keel.refuse_event_change() trigger guards) no role but the owner may UPDATE, DELETE or
-- TRUNCATE, and enabled triggers refuse UPDATE, DELETE and TRUNCATE; a disabled one is
-- named (G4).
with append_only as (
    select c.oid
    from pg_catalog.pg_class as c
    where c.oid = to_regclass('keel.task_events')
    union
    select t.tgrelid
    from pg_catalog.pg_trigger as t
    inner join pg_catalog.pg_class as c on t.tgrelid = c.oid
    inner join pg_catalog.pg_namespace as n on c.relnamespace = n.oid
    where n.nspname = 'keel' and t.tgfoid = to_regprocedure('keel.refuse_event_change()')
),

guards as (
    select
        t.tgrelid,
        t.tgname,
        t.tgenabled,
        t.tgtype
    from pg_catalog.pg_trigger as t
    where
        t.tgrelid in (select a.oid from append_only as a)
        and t.tgfoid = to_regprocedure('keel.refuse_event_change()')
),

-- The BEFORE triggers an append-only table needs: (tgtype bits, what they refuse).
-- Bits: 1 row, 2 before, 8 delete, 16 update, 32 truncate.
required (bits, change) as (
    values (1 + 2 + 16, 'UPDATE'), (1 + 2 + 8, 'DELETE'), (2 + 32, 'TRUNCATE')
)

select
    'events_append_only' as rule,
    'G4' as guarantee,
    'error' as level,
    c.oid::regclass::text as object,
    format('%s may %s events', coalesce(r.rolname, 'PUBLIC'), acl.privilege_type) as problem,
    format(
        'REVOKE %s ON %s FROM %s;', acl.privilege_type, c.oid::regclass, coalesce(quote_ident(r.rolname), 'PUBLIC')
    ) as remedy
from append_only as a
inner join pg_catalog.pg_class as c on a.oid = c.oid
cross join lateral pg_catalog.aclexplode(c.relacl) as acl
left join pg_catalog.pg_roles as r on acl.grantee = r.oid
where
    acl.privilege_type in ('UPDATE', 'DELETE', 'TRUNCATE')
    and acl.grantee <> c.relowner

union all

select
    'events_append_only',
    'G4',
    'error',
    a.oid::regclass::text,
    format(
        'the append-only trigger is missing or disabled: nothing refuses %s (even by the owner)',
        q.change
    ),
    'Run `agentkeel migrate up` (policies/05_append_only.sql), or ALTER TABLE ... ENABLE TRIGGER for the disabled one.'
from append_only as a
cross join required as q
where
    not exists (
        select 1 from guards as g
        where
            g.tgrelid = a.oid
            and g.tgenabled in ('O', 'A')
            and (g.tgtype::integer & (1 + 2 + 64)) = (q.bits & 3)
            and (g.tgtype::integer & q.bits) = q.bits
    )

union all

select
    'events_append_only',
    'G4',
    'error',
    g.tgrelid::regclass::text,
    format(
        'the append-only trigger %I is disabled%s',
        g.tgname,
        case when g.tgenabled = 'R' then ' (it fires only with session_replication_role = replica)' end
    ),
    format('ALTER TABLE %s ENABLE TRIGGER %I;', g.tgrelid::regclass, g.tgname)
from guards as g
where g.tgenabled not in ('O', 'A')
order by 4, 5;
