-- Leases with fencing (G5): claim the next due task of any tenant.
-- agentkeel:allow citus.tenant_filter (the one cross-tenant claim, replaced on Citus)
-- The one cross-tenant claim, and its fairness: a single FOR UPDATE SKIP LOCKED over the
-- due index, oldest wake_at first. A row another transaction has locked is skipped, never
-- waited on and never allowed to hide the rows behind it, so the claim makes progress
-- whenever any unlocked due task exists, whoever holds locks on how many rows. Wake times
-- are clamped to [now, now + max_wake_delay] when stored (keel.check_wake_at), so no
-- tenant can queue ahead of work that is already due. A distributed deployment replaces
-- this function (unlocked candidate scan, then a per-tenant SKIP LOCKED claim:
-- tools/agentkeel/citus/claim_next_task.sql, installed by agentkeel distribute); callers
-- do not change.
create or replace function keel.claim_next_task(
    p_owner text,
    p_lease interval default '30 seconds',
    p_workflow text default null
)
returns setof keel.tasks
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_now timestamptz := clock_timestamp();
    v_expires timestamptz;
    v_task keel.tasks;
begin
    v_expires := keel.check_lease_request(p_owner, p_lease, v_now);

    -- Only this statement sees and locks rows of every tenant (policies tasks_claim_scan
    -- and tasks_claim_lock); the flag is off again before anything is written.
    perform keel.set_claim_scan(true);
    select t.* into v_task
    from keel.tasks as t
    where t.wake_at <= v_now
        and (t.lease_expires_at is null or t.lease_expires_at <= v_now)
        and (p_workflow is null or t.workflow = p_workflow)
    order by t.wake_at
    limit 1
    for update skip locked;
    perform keel.set_claim_scan(false);
    if v_task.task_id is null then
        return;  -- nothing due, or every due task is locked by someone else
    end if;

    -- The claimed task's tenant becomes the transaction's context.
    perform keel.set_tenant_context(v_task.tenant_id);
    return next keel.claim_locked_task(v_task, p_owner, v_now, v_expires);
end;
$$;

comment on function keel.claim_next_task(text, interval, text) is
'Leases the task of any tenant that has been due longest (wake_at <= now, no valid lease), optionally of one workflow. Rows locked by other transactions are skipped, so it returns a task whenever any unlocked due task exists; concurrent claimers never wait on or share a task. Sets the claimed task''s tenant as the transaction''s context. Returns no row when nothing claimable is due.';
