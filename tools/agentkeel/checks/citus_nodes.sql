-- agentkeel check: on Citus, every worker holds what the coordinator promises (G1).
-- agentkeel:needs citus superuser (run_command_on_workers; without Citus it reports nothing)
-- The other rules read the coordinator's catalog; a worker has a catalog of its own, with
-- the shards, where a login that reached it could have changed something the coordinator
-- never shows. Asked of every worker through run_command_on_workers, as the superuser or
-- owner running the check:
--   - keel_owner may log in (then Citus could reach a node as the owner of the tables);
--   - the token signing keys are on the worker (they belong to the coordinator alone);
--   - the context keys differ from the coordinator's (agents' proofs would not verify);
--   - PUBLIC may execute a keel function;
--   - a keel function, or a privilege on a keel table or shard, that the coordinator
--     does not have (an extra definer function, a grant made on the worker);
--   - a tenant table or shard without row-level security enabled and forced;
--   - a disabled or replica-only trigger on a keel table or shard (append-only history).
-- A worker the command cannot reach is a finding too.
with coordinator as (
    select
        coalesce(
            (
                select array_agg(p.oid::regprocedure::text)
                from pg_catalog.pg_proc as p
                where p.pronamespace = 'keel'::regnamespace
            ),
            '{}'
        ) as keel_functions,
        coalesce(
            (
                select
                    array_agg(
                        c.relname || ':' || pg_catalog.quote_ident(a.grantee::regrole::text)
                        || ':' || a.privilege_type
                    )
                from pg_catalog.pg_class as c,
                    pg_catalog.aclexplode(c.relacl) as a
                where c.relnamespace = 'keel'::regnamespace and a.grantee <> 0
            ),
            '{}'
        ) as keel_grants,
        (
            select
                coalesce(
                    string_agg(
                        k.key_version::text || ':' || coalesce(k.retired_at::text, '')
                        || ':' || md5(k.inner_key || k.outer_key),
                        ',' order by k.key_version
                    ),
                    ''
                )
            from keel.context_keys as k
        ) as context_keys
),

worker as (
    select
        w.nodename,
        w.nodeport,
        w.success,
        w.result
    from coordinator as c,
        pg_catalog.run_command_on_workers(
            format(
                $worker$
select coalesce(jsonb_agg(p), '[]')::text from (
    select jsonb_build_object('object', 'keel_owner',
        'problem', 'keel_owner may log in on this node',
        'remedy', 'ALTER ROLE keel_owner NOLOGIN; (agentkeel distribute does)') as p
    from pg_catalog.pg_roles as r where r.rolname = 'keel_owner' and r.rolcanlogin
    union all
    select jsonb_build_object('object', 'keel.tenant_token_keys',
        'problem', 'the token signing keys are on this worker',
        'remedy', 'DROP TABLE keel.tenant_token_keys; on the worker (agentkeel distribute does)')
    where pg_catalog.to_regclass('keel.tenant_token_keys') is not null
    union all
    select jsonb_build_object('object', 'keel.context_keys',
        'problem', 'the context keys differ from the coordinator''s',
        'remedy', 'agentkeel distribute (copies them)')
    where pg_catalog.to_regclass('keel.context_keys') is null
        or (select coalesce(string_agg(k.key_version::text || ':'
            || coalesce(k.retired_at::text, '') || ':' || md5(k.inner_key || k.outer_key),
            ',' order by k.key_version), '') from keel.context_keys as k) <> %L
    union all
    select jsonb_build_object('object', p.oid::regprocedure::text,
        'problem', 'PUBLIC may execute it on this node',
        'remedy', 'agentkeel distribute (applies the shipped privileges again)')
    from pg_catalog.pg_proc as p
    where p.pronamespace = 'keel'::regnamespace and (p.proacl is null
        or exists (select 1 from pg_catalog.aclexplode(p.proacl) as a where a.grantee = 0))
    union all
    select jsonb_build_object('object', p.oid::regprocedure::text,
        'problem', 'a function on this node that the coordinator does not have',
        'remedy', format('DROP FUNCTION %%s; on the worker', p.oid::regprocedure))
    from pg_catalog.pg_proc as p
    where p.pronamespace = 'keel'::regnamespace
        and p.oid::regprocedure::text <> all (%L::text[])
    union all
    select jsonb_build_object('object', c.oid::regclass::text,
        'problem', format('%%s has %%s on it on this node, beyond the coordinator''s grants',
            g.name, a.privilege_type),
        'remedy', format('REVOKE %%s ON %%s FROM %%s; on the worker',
            a.privilege_type, c.oid::regclass, g.name))
    from pg_catalog.pg_class as c, pg_catalog.aclexplode(c.relacl) as a,
        lateral (select case when a.grantee = 0 then 'PUBLIC'
            else pg_catalog.quote_ident(a.grantee::regrole::text) end as name) as g
    where c.relnamespace = 'keel'::regnamespace and a.grantee <> c.relowner
        and regexp_replace(c.relname, '_[0-9]+$', '') || ':' || g.name
            || ':' || a.privilege_type <> all (%L::text[])
        and c.relname || ':' || g.name || ':' || a.privilege_type <> all (%L::text[])
    union all
    select jsonb_build_object('object', c.oid::regclass::text,
        'problem', 'row-level security is not enabled and forced on this node',
        'remedy', format('ALTER TABLE %%s ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;'
            || ' on the worker', c.oid::regclass))
    from pg_catalog.pg_class as c
    where c.relnamespace = 'keel'::regnamespace and c.relkind in ('r', 'p')
        and exists (select 1 from pg_catalog.pg_attribute as t where t.attrelid = c.oid
            and t.attname = 'tenant_id' and not t.attisdropped)
        and not (c.relrowsecurity and c.relforcerowsecurity)
    union all
    select jsonb_build_object('object', c.oid::regclass::text || ' ' || t.tgname,
        'problem', 'a trigger is disabled (or replica-only) on this node',
        'remedy', format('ALTER TABLE %%s ENABLE TRIGGER %%I; on the worker', c.oid::regclass,
            t.tgname))
    from pg_catalog.pg_trigger as t
    join pg_catalog.pg_class as c on c.oid = t.tgrelid
    where c.relnamespace = 'keel'::regnamespace and not t.tgisinternal
        and t.tgenabled in ('D', 'R')
) as s
$worker$,
                c.context_keys, c.keel_functions, c.keel_grants, c.keel_grants
            )
        ) as w
)

select
    'citus_nodes' as rule,
    'G1' as guarantee,
    'error' as level,
    w.nodename || ':' || w.nodeport || ' ' || (f.value ->> 'object') as object,
    f.value ->> 'problem' as problem,
    f.value ->> 'remedy' as remedy
from worker as w,
    jsonb_array_elements(case when w.success then w.result::jsonb else '[]' end) as f (value)
union all
select
    'citus_nodes' as rule,
    'G1' as guarantee,
    'error' as level,
    w.nodename || ':' || w.nodeport as object,
    'the worker could not be checked: ' || w.result as problem,
    'Check that the node is up and reachable from the coordinator, then check again.' as remedy
from worker as w
where not w.success
order by object, problem;
