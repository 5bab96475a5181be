-- agentkeel check: keel_agent and keel_worker, and every login role that is a member of
-- them, carry statement_timeout and idle_in_transaction_session_timeout, at or below the
-- caps keel.watchdog enforces (keel.watchdog_caps), and no transaction_timeout above its
-- cap (G7). Role settings apply to the login role only, so members need their own; they
-- are defaults a session may lift, which is what the watchdog is for.
with acting as (
    select
        r.oid,
        r.rolname,
        case
            when pg_catalog.pg_has_role(r.oid, 'keel_agent', 'member') then 'keel_agent'
            else 'keel_worker'
        end as role_group
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
),

-- Each role's own value of a setting: the one for this database, else the one for all.
configured as (
    select distinct on (s.setrole, split_part(c.config, '=', 1))
        s.setrole as oid,
        split_part(c.config, '=', 1) as setting,
        substr(c.config, strpos(c.config, '=') + 1) as value
    from pg_catalog.pg_db_role_setting as s
    cross join lateral unnest(s.setconfig) as c (config)
    where
        s.setdatabase in (0, (
            select d.oid from pg_catalog.pg_database as d
            where d.datname = current_database()
        ))
    order by s.setrole asc, split_part(c.config, '=', 1) asc, s.setdatabase desc
),

-- A time setting without a unit is in milliseconds.
measured as (
    select
        a.rolname,
        x.setting,
        x.value,
        k.cap,
        case
            when x.value ~ '^[0-9]+(\.[0-9]+)?$' then x.value::numeric * interval '1 millisecond'
            else x.value::interval
        end as configured
    from acting as a
    inner join configured as x on a.oid = x.oid
    inner join keel.watchdog_caps() as k on a.role_group = k.role_group and x.setting = k.setting
)

select
    'role_timeouts' as rule,
    'G7' as guarantee,
    'error' as level,
    a.rolname::text as object,
    format('no %s default (or it is 0)', q.setting) as problem,
    format('ALTER ROLE %I SET %s = ''...'';  -- see docs/security.md, Roles', a.rolname, q.setting) as remedy
from acting as a
cross join required as q
where
    not exists (
        select 1 from measured as m
        where m.rolname = a.rolname and m.setting = q.setting and m.configured > interval '0'
    )
union all
select
    'role_timeouts',
    'G7',
    'error',
    m.rolname::text,
    format(
        '%s = %s exceeds the watchdog''s cap of %s (keel.watchdog_caps; 0 is no limit)',
        m.setting, m.value, m.cap
    ),
    format(
        'ALTER ROLE %I SET %s = ''%s'';  -- or raise the cap in keel.settings',
        m.rolname, m.setting, trim_scale(extract(epoch from m.cap))::text || 's'
    )
from measured as m
where m.configured > m.cap or (m.configured = interval '0' and m.setting = 'transaction_timeout')
order by object, problem;
