-- Leases with fencing (G5): claim one named task of one tenant if it is still due, else
-- nothing. The per-tenant half of the cross-tenant claim on Citus (the variant of
-- keel.claim_next_tasks finds candidates with an unlocked scan, then calls this for each
-- one, on the node that holds its tenant): a task someone else holds (a row lock, an
-- unexpired lease) or that is no longer due is skipped, never waited on and never an
-- error, so a tenant holding locks cannot stall the claims of another.
-- agentkeel:allow citus.require_tenant (it sets the tenant it acts for, then keel.adopt_tenant checks it: see the body)
-- It acts for p_tenant_id only while it runs: a transaction that had no context has none
-- afterwards, so one claim transaction can try candidates of several tenants.
create or replace function keel.claim_due_task(
    p_tenant_id uuid,
    p_task_id uuid,
    p_owner text,
    p_lease interval default '30 seconds',
    p_workflow text default null
)
returns setof keel.tasks
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
as $$
declare
    v_now timestamptz := clock_timestamp();
    v_had_context boolean := keel.current_tenant() is not null;
    v_expires timestamptz;
    v_max_recoveries integer;
    v_task keel.tasks;
begin
    -- Adopted here, explicitly, not by keel.require_tenant: on Citus this runs inside
    -- the claim's transaction on the tenant's node, where require_tenant adopts nothing
    -- (a context adopted there would be this node's alone; this function gives it back).
    if not v_had_context then
        perform keel.set_tenant_context(p_tenant_id);
    end if;
    -- adopt_tenant, not require_tenant: a tenant being deleted is skipped by no claim,
    -- and must not fail one for every other tenant; the deleter removes what it takes.
    perform keel.adopt_tenant(p_tenant_id);
    v_expires := keel.check_lease_request(p_owner, p_lease, v_now);
    v_max_recoveries := keel.max_recovery_attempts();
    if p_task_id is not null then
        select t.* into v_task
        from keel.tasks as t
        where t.tenant_id = p_tenant_id
            and t.task_id = p_task_id
            and t.wake_at <= v_now
            and (t.lease_expires_at is null or t.lease_expires_at <= v_now)
            and (p_workflow is null or t.workflow = p_workflow)
            -- A lease that expired unreleased as often as allowed: the recoverer's to fail.
            and (t.lease_owner is null or t.recovery_attempts < v_max_recoveries)
        for update skip locked;
    else
        -- No task named: the tenant's longest-due one that is not locked, found on this
        -- node past any number of locked ones (the Citus claim, for a tenant whose
        -- candidates it could not take one by one).
        select t.* into v_task
        from keel.tasks as t
        where t.tenant_id = p_tenant_id
            and t.wake_at <= v_now
            and (t.lease_expires_at is null or t.lease_expires_at <= v_now)
            and (p_workflow is null or t.workflow = p_workflow)
            and (t.lease_owner is null or t.recovery_attempts < v_max_recoveries)
        order by t.wake_at
        limit 1
        for update skip locked;
    end if;
    if found then
        return next keel.claim_locked_task(v_task, p_owner, v_now, v_expires);
    end if;
    if not v_had_context then
        perform keel.set_tenant_context(null);
    end if;
end;
$$;

comment on function keel.claim_due_task(uuid, uuid, text, interval, text) is
'Leases the task to p_owner for p_lease (at most 7 days) with its next fencing token and returns it, if it is still due (wake_at <= now, no valid lease, of p_workflow when given, not at the recovery maximum); returns no row when another transaction holds it locked or it is not claimable, and never waits. With p_task_id null, the tenant''s longest-due claimable task that no transaction holds locked. A transaction that had no tenant context has none afterwards. The per-tenant step of the Citus variant of keel.claim_next_tasks (G5).';
