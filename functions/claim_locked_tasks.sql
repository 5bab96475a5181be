-- Leases with fencing (G5): the one place a lease is granted and the token incremented,
-- for any number of one tenant's task rows the caller has locked, in one statement.
-- Taking over a lease that expired unreleased (its holder crashed, hung or forgot to
-- release) counts as a recovery, whoever takes it over: keel.claim_next_tasks stops
-- offering a task once settings.max_recovery_attempts is reached, and the recoverer then
-- fails it (RECOVERY_EXHAUSTED), so a task that kills every worker cannot cycle forever.
create or replace function keel.claim_locked_tasks(
    p_tenant_id uuid,
    p_task_ids uuid[],
    p_owner text,
    p_now timestamptz,
    p_expires timestamptz
)
returns setof keel.tasks
language plpgsql
volatile
-- No SET search_path: granted to no role, it runs in its caller's pinned one.
as $$
begin
    return query
    update keel.tasks as t
    set
        fencing_token = t.fencing_token + 1,
        lease_owner = p_owner,
        lease_acquired_at = p_now,
        lease_expires_at = p_expires,
        wake_at = p_expires,
        -- A lease still recorded here is an expired one: the callers refuse a live lease.
        recovery_attempts = t.recovery_attempts
            + (case when t.lease_owner is not null then 1 else 0 end),
        updated_at = p_now
    where t.tenant_id = p_tenant_id and t.task_id = any(p_task_ids)
    returning t.*;
end;
$$;

comment on function keel.claim_locked_tasks(uuid, uuid[], text, timestamptz, timestamptz) is
'Grants the lease on task rows of tenant p_tenant_id that the caller has locked, in one statement: next fencing token, owner, expiry, and wake_at = expiry so an expired lease makes the task due again; taking over a lease that expired unreleased adds one to recovery_attempts. Returns the rows, in no set order. Shared by keel.claim_locked_task and keel.claim_next_tasks; not granted to any role.';
