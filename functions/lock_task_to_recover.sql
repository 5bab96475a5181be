-- Leases with fencing (G5): the recoverer's one cross-tenant part.
-- agentkeel:allow citus.tenant_filter (the one cross-tenant scan of the recoverer, replaced on Citus)
-- agentkeel:allow citus.delegation (a cross-tenant scan, never delegated: p_tenant only narrows it; replaced on Citus)
-- agentkeel:allow citus.set_local_autocommit (on PostgreSQL its SET LOCALs hold in autocommit too; on Citus this scan is replaced by the candidate scan of CITUS.md (b) 1)
-- Like keel.claim_next_task: a single FOR UPDATE SKIP LOCKED over the leased rows, oldest
-- expiry first. A row another transaction has locked is skipped, never waited on, so no
-- tenant's locks keep the recoverer from another tenant's stale tasks. A distributed
-- deployment replaces this function (unlocked candidate scan, then a per-tenant SKIP
-- LOCKED lock); keel.recover_stale_tasks does not change.
drop function if exists keel.lock_task_to_recover(timestamptz, text, timestamptz);
create or replace function keel.lock_task_to_recover(
    p_now timestamptz,
    p_workflow text default null,
    p_after timestamptz default '-infinity',
    p_tenant uuid default null
)
returns keel.tasks
language plpgsql
volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    v_task keel.tasks;
begin
    -- Only this statement sees and locks rows of every tenant (policies tasks_claim_scan
    -- and tasks_claim_lock); the flag is off again before anything is written.
    perform keel.set_claim_scan(true);
    select t.* into v_task
    from keel.tasks as t
    where t.lease_owner is not null
        and t.lease_expires_at <= p_now
        -- A caller that takes stale tasks one after the other passes the last expiry it
        -- took: the rows it recovered before it still sit in the index (dead until
        -- vacuum), and the scan starts past them instead of rechecking each one again.
        and t.lease_expires_at >= p_after
        and (p_workflow is null or t.workflow = p_workflow)
        -- A transaction that acts for a tenant recovers only that tenant's tasks.
        and (p_tenant is null or t.tenant_id = p_tenant)
    order by t.lease_expires_at
    limit 1
    for update skip locked;
    perform keel.set_claim_scan(false);
    return v_task;  -- all null when no unlocked expired lease exists
end;
$$;

comment on function keel.lock_task_to_recover(timestamptz, text, timestamptz, uuid) is
'Locks the task of any tenant (of p_tenant when given) whose lease expired longest ago (lease_owner set, p_after <= lease_expires_at <= p_now), optionally of one workflow, skipping rows other transactions have locked; returns it, or a row of nulls when there is none. The cross-tenant part of keel.recover_stale_tasks, replaced on Citus; not granted to any role.';
