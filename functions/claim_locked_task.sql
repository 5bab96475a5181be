-- Leases with fencing (G5): grant the lease on one task row the caller has locked, through
-- keel.claim_locked_tasks, the one place a lease is granted.
-- agentkeel:requires functions/claim_locked_tasks.sql
create or replace function keel.claim_locked_task(
    p_task keel.tasks,
    p_owner text,
    p_now timestamptz,
    p_expires timestamptz
)
returns keel.tasks
language plpgsql
volatile
-- No SET search_path: granted to no role, it runs in its caller's pinned one.
as $$
declare
    v_task keel.tasks;
begin
    select c.* into v_task
    from keel.claim_locked_tasks(p_task.tenant_id, array[p_task.task_id], p_owner, p_now, p_expires) as c;
    return v_task;
end;
$$;

comment on function keel.claim_locked_task(keel.tasks, text, timestamptz, timestamptz) is
'Grants the lease on a task row the caller has locked (keel.claim_locked_tasks with one task): next fencing token, owner, expiry, and wake_at = expiry so an expired lease makes the task due again; taking over a lease that expired unreleased adds one to recovery_attempts. Shared by keel.claim_lease, keel.claim_due_task and keel.recover_locked_task; not granted to any role.';
