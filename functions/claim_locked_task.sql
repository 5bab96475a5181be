-- Leases with fencing (G5): the one place a lease is granted and the token incremented.
-- Taking over a lease that expired unreleased (its holder crashed, hung or forgot to
-- release) counts as a recovery, whoever takes it over: keel.claim_next_tasks stops
-- offering a task once settings.max_recovery_attempts is reached, and the recoverer then
-- fails it (RECOVERY_EXHAUSTED), so a task that kills every worker cannot cycle forever.
create or replace function keel.claim_locked_task(
    p_task keel.tasks,
    p_owner text,
    p_now timestamptz,
    p_expires timestamptz
)
returns keel.tasks
language plpgsql
volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    v_token bigint := p_task.fencing_token + 1;
    -- A lease still recorded here is an expired one: the callers refuse a live lease.
    v_recoveries integer := p_task.recovery_attempts
        + (case when p_task.lease_owner is not null then 1 else 0 end);
    v_task keel.tasks;
begin
    update keel.tasks as t
    set
        fencing_token = v_token,
        lease_owner = p_owner,
        lease_acquired_at = p_now,
        lease_expires_at = p_expires,
        wake_at = p_expires,
        recovery_attempts = v_recoveries,
        updated_at = p_now
    where t.tenant_id = p_task.tenant_id and t.task_id = p_task.task_id
    returning t.* into v_task;
    return v_task;
end;
$$;

comment on function keel.claim_locked_task(keel.tasks, text, timestamptz, timestamptz) is
'Grants the lease on a task row the caller has locked: next fencing token, owner, expiry, and wake_at = expiry so an expired lease makes the task due again; taking over a lease that expired unreleased adds one to recovery_attempts. Shared by keel.claim_lease and keel.claim_next_task; not granted to any role.';
