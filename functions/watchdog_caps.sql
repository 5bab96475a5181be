-- Limits enforced from outside an agent's session (G7): the one reading of the caps in
-- keel.settings that keel.watchdog enforces and `agentkeel check` compares role settings
-- with. measure names the server setting that bounds the same thing inside a session.
create or replace function keel.watchdog_caps()
returns table (role_group text, measure text, setting text, cap interval)
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
    select
        g.role_group,
        m.measure,
        m.setting,
        -- No row: the default. A value of 0 (or less) turns the cap off: null.
        pg_catalog.make_interval(secs => nullif(greatest(coalesce(
            (
                select s.value::double precision
                from keel.settings as s
                where s.setting = pg_catalog.format('%s_max_%s_seconds', g.prefix, m.key)
            ),
            case g.prefix when 'agent' then m.agent_default else m.worker_default end
        ), 0), 0))
    from (values ('keel_agent', 'agent'), ('keel_worker', 'worker')) as g (role_group, prefix)
    cross join (
        values
        ('statement', 'statement', 'statement_timeout', 30, 120),
        ('transaction', 'transaction', 'transaction_timeout', 60, 600),
        (
            'idle in transaction', 'idle_in_transaction',
            'idle_in_transaction_session_timeout', 30, 120
        )
    ) as m (measure, key, setting, agent_default, worker_default)
    order by 1, 2
$$;

comment on function keel.watchdog_caps() is
'The caps keel.watchdog enforces on the backends of keel_agent and keel_worker members, from settings.<agent|worker>_max_<statement|transaction|idle_in_transaction>_seconds (defaults 30/60/30 s for agents, 120/600/120 s for workers; 0 turns a cap off: null); setting names the server setting bounding the same time inside a session, which `agentkeel check` keeps at or below the cap.';
