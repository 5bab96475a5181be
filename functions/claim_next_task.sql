-- Leases with fencing (G5): claim the next due task of any tenant.
-- agentkeel:allow citus.tenant_filter (the one cross-tenant scan, replaced on Citus)
-- agentkeel:allow citus.set_local_autocommit (on PostgreSQL its SET LOCALs hold in autocommit too; on Citus this claim is replaced by the candidate scan of CITUS.md (b) 1)
-- The one cross-tenant claim. It scans for candidates without locks, then claims one
-- inside its tenant with FOR UPDATE SKIP LOCKED: the same shape a distributed
-- deployment needs, so callers never change.
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
    v_tenants uuid[];
    v_tasks uuid[];
    v_task keel.tasks;
    v_prior_context text := coalesce(current_setting('keel.tenant_id', true), '');
begin
    perform keel.check_lease_request(p_owner, p_lease);
    v_expires := v_now + p_lease;

    for v_round in 1..4 loop
        -- Only this scan sees every tenant (policy tasks_claim_scan); the flag is off
        -- again before any row is locked or written.
        execute 'set local keel.scan_all_tenants = on';
        select array_agg(c.tenant_id order by c.wake_at), array_agg(c.task_id order by c.wake_at)
        into v_tenants, v_tasks
        from (
            select t.tenant_id, t.task_id, t.wake_at
            from keel.tasks as t
            where t.wake_at <= v_now
                and (t.lease_expires_at is null or t.lease_expires_at <= v_now)
                and (p_workflow is null or t.workflow = p_workflow)
            order by t.wake_at
            limit 16
        ) as c;
        execute 'set local keel.scan_all_tenants = off';
        if v_tasks is null then
            exit;  -- nothing due
        end if;

        for i in 1..array_length(v_tasks, 1) loop
            -- The candidate's tenant becomes the transaction's context.
            execute format('set local keel.tenant_id = %L', v_tenants[i]);
            select t.* into v_task
            from keel.tasks as t
            where t.tenant_id = v_tenants[i]
                and t.task_id = v_tasks[i]
                and t.wake_at <= v_now
                and (t.lease_expires_at is null or t.lease_expires_at <= v_now)
            for update skip locked;
            if found then
                return next keel.claim_locked_task(v_task, p_owner, v_now, v_expires);
                return;
            end if;
        end loop;
        -- Concurrent claimers took every candidate: scan again.
    end loop;
    -- Nothing claimed: leave the caller's context as it was.
    execute format('set local keel.tenant_id = %L', v_prior_context);
end;
$$;

comment on function keel.claim_next_task(text, interval, text) is
'Leases the task of any tenant that has been due longest (wake_at <= now, no valid lease), optionally of one workflow. Concurrent claimers never wait on or share a task (SKIP LOCKED). Sets the claimed task''s tenant as the transaction''s context. Returns no row when nothing is due.';
