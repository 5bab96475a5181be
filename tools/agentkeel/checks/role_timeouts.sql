-- agentkeel check: keel_agent and keel_worker, and every login role that is a member of
-- them, carry statement_timeout and idle_in_transaction_session_timeout (G7). Role
-- settings apply to the login role only, so members need their own.
with acting as (
    select
        r.oid,
        r.rolname
    from pg_catalog.pg_roles as r
    where
        r.rolname in ('keel_agent', 'keel_worker')
        or (
            r.rolcanlogin and not r.rolsuper
            and (
                pg_catalog.pg_has_role(r.oid, 'keel_agent', 'member')
                or pg_catalog.pg_has_role(r.oid, 'keel_worker', 'member')
            )
        )
),

required (setting) as (
    values ('statement_timeout'), ('idle_in_transaction_session_timeout')
)

select
    'role_timeouts' as rule,
    'G7' as guarantee,
    'error' as level,
    a.rolname::text as object,
    format('no %s default (or it is 0)', q.setting) as problem,
    format('ALTER ROLE %I SET %s = ''...'';  -- see README, Roles', a.rolname, q.setting) as remedy
from acting as a
cross join required as q
where
    not exists (
        select 1
        from pg_catalog.pg_db_role_setting as s
        cross join lateral unnest(s.setconfig) as c (config)
        where
            s.setrole = a.oid
            and s.setdatabase in (0, (
                select d.oid from pg_catalog.pg_database as d
                where d.datname = current_database()
            ))
            and split_part(c.config, '=', 1) = q.setting
            and split_part(c.config, '=', 2) not in ('0', '')
    )
order by 4, 5;
