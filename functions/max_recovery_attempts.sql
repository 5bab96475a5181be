-- Leases with fencing (G5): how many expired, unreleased leases a task survives.
create or replace function keel.max_recovery_attempts()
returns integer
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_max integer;
begin
    select s.value::integer into v_max
    from keel.settings as s
    where s.setting = 'max_recovery_attempts';
    return coalesce(v_max, 5);
end;
$$;

comment on function keel.max_recovery_attempts() is
'settings.max_recovery_attempts (default 5): how many times a task''s lease may expire unreleased and be taken over (by keel.claim_next_tasks or keel.recover_stale_tasks) before the recoverer fails it. Internal: not granted to any role.';
