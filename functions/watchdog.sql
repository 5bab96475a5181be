-- Limits enforced from outside an agent's session (G7): statement_timeout and the other
-- role settings are defaults the session may lift (SET, or ALTER ROLE on its own login).
-- The watchdog ends, from another backend, every backend of a keel_agent or keel_worker
-- member in this database whose statement, transaction or idle time inside a transaction
-- is past keel.watchdog_caps(). `agentkeel watchdog` calls it in a loop.
create or replace function keel.watchdog(p_terminate boolean default true)
returns table (
    pid integer,
    login text,
    role_group text,
    measure text,
    elapsed interval,
    cap interval,
    terminated boolean
)
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
    -- Other logins' backends show their times to members of pg_read_all_stats only, and
    -- only pg_signal_backend may end them: without those the watchdog would see nothing.
    if not (
        pg_catalog.pg_has_role(current_user, 'pg_read_all_stats', 'usage')
        and (not p_terminate or pg_catalog.pg_has_role(current_user, 'pg_signal_backend', 'usage'))
    ) then
        raise exception using
            errcode = '42501',
            message = 'keel.watchdog needs pg_read_all_stats, and pg_signal_backend to end backends',
            hint = 'As a superuser: GRANT pg_read_all_stats, pg_signal_backend TO <the watchdog login> (docs/security.md, Roles).';
    end if;
    return query
        with backends as (
            select
                a.pid,
                r.rolname::text as login,
                case
                    when pg_catalog.pg_has_role(a.usesysid, 'keel_agent', 'member') then 'keel_agent'
                    else 'keel_worker'
                end as role_group,
                a.state,
                a.xact_start,
                a.query_start,
                a.state_change
            from pg_catalog.pg_stat_activity as a
            inner join pg_catalog.pg_roles as r on a.usesysid = r.oid
            where
                a.datname = pg_catalog.current_database()
                and a.backend_type = 'client backend'
                and a.pid <> pg_catalog.pg_backend_pid()
                and not r.rolsuper
                and not pg_catalog.pg_has_role(a.usesysid, 'keel_owner', 'member')
                and (
                    pg_catalog.pg_has_role(a.usesysid, 'keel_agent', 'member')
                    or pg_catalog.pg_has_role(a.usesysid, 'keel_worker', 'member')
                )
        ),

        measured as (
            select
                b.pid,
                b.login,
                b.role_group,
                c.measure,
                pg_catalog.clock_timestamp() - case c.measure
                    when 'transaction' then b.xact_start
                    when 'statement' then case when b.state = 'active' then b.query_start end
                    else case when b.state like 'idle in transaction%' then b.state_change end
                end as elapsed,
                c.cap
            from backends as b
            inner join keel.watchdog_caps() as c on b.role_group = c.role_group
        ),

        -- The measure furthest past its cap, per backend; each backend is ended once.
        worst as (
            select distinct on (m.pid) m.*
            from measured as m
            where m.elapsed > m.cap
            order by m.pid, m.elapsed - m.cap desc
        )

        select
            w.pid,
            w.login,
            w.role_group,
            w.measure,
            w.elapsed,
            w.cap,
            p_terminate and pg_catalog.pg_terminate_backend(w.pid)
        from worst as w;
end;
$$;

comment on function keel.watchdog(boolean) is
'Ends (pg_terminate_backend) every backend in this database of a keel_agent or keel_worker member, superusers and keel_owner members aside, whose statement, open transaction or idle time inside a transaction is past keel.watchdog_caps(), whatever the session set; one row per backend past a cap, with the measure furthest past it. p_terminate false only reports. SECURITY INVOKER: its caller needs pg_read_all_stats and pg_signal_backend (42501 otherwise); granted to keel_watchdog.';
