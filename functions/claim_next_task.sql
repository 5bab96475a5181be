-- Leases with fencing (G5): claim the next due task of any tenant.
-- The one cross-tenant claim: a distributed deployment replaces this function
-- (candidate scan, then keel.claim_lease per tenant) without touching callers.
create or replace function keel.claim_next_task(
    p_owner text,
    p_lease interval default '30 seconds',
    p_workflow text default null
)
returns setof keel.tasks
language plpgsql
volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    v_now timestamptz := clock_timestamp();
    v_expires timestamptz;
    v_tenant_id uuid;
    v_task_id uuid;
    v_token bigint;
begin
    perform keel.check_lease_request(p_owner, p_lease);
    v_expires := v_now + p_lease;

    select t.tenant_id, t.task_id, t.fencing_token + 1
    into v_tenant_id, v_task_id, v_token
    from keel.tasks as t
    where t.wake_at <= v_now
        and (t.lease_expires_at is null or t.lease_expires_at <= v_now)
        and (p_workflow is null or t.workflow = p_workflow)
    order by t.wake_at
    limit 1
    for update skip locked;
    if not found then
        return;
    end if;

    return query
    update keel.tasks as t
    set
        fencing_token = v_token,
        lease_owner = p_owner,
        lease_acquired_at = v_now,
        lease_expires_at = v_expires,
        wake_at = v_expires,
        updated_at = v_now
    where t.tenant_id = v_tenant_id and t.task_id = v_task_id
    returning t.*;
end;
$$;

comment on function keel.claim_next_task(text, interval, text) is
'Leases the task of any tenant that has been due longest (wake_at <= now, no valid lease), optionally of one workflow, with FOR UPDATE SKIP LOCKED so concurrent claimers never wait on or share a task. Returns no row when nothing is due.';
