-- Leases with fencing (G5): claim the next due tasks of any tenant, up to a limit.
-- agentkeel:requires functions/claim_locked_tasks.sql
-- agentkeel:allow citus.tenant_filter (the one cross-tenant claim, replaced on Citus)
-- The one cross-tenant claim, and its fairness: a single FOR UPDATE SKIP LOCKED over the
-- due index, oldest wake_at first. A row another transaction has locked is skipped, never
-- waited on and never allowed to hide the rows behind it, so the claim makes progress
-- whenever any unlocked due task exists, whoever holds locks on how many rows. Wake times
-- are clamped to [now, now + max_wake_delay] when stored (keel.check_wake_at), so no
-- tenant can queue ahead of work that is already due. keel.claim_next_task is this claim
-- with a limit of one. A distributed deployment replaces this function (unlocked
-- candidate scan, then a per-tenant SKIP LOCKED claim:
-- tools/agentkeel/citus/claim_next_tasks.sql, installed by agentkeel distribute); callers
-- do not change.
create or replace function keel.claim_next_tasks(
    p_owner text,
    p_limit integer default 100,
    p_lease interval default '30 seconds',
    p_workflow text default null
)
returns setof keel.tasks
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
-- One plan per session for every statement here, made once: a custom plan per call (the
-- default, since the scan's generic estimate looks dearer) cost more planning than the
-- claim itself. With sorting and sequential scans off, that one plan reads the due index
-- in wake_at order and each lease is written through the primary key, whatever the
-- statistics said when it was made (a bulk load with stale statistics once produced a
-- plan that sorted every due row, on every claim; a plan made while keel.tasks was nearly
-- empty would scan the whole table for each lease as it grows).
set plan_cache_mode = force_generic_plan
set enable_sort = off
set enable_seqscan = off
-- Those settings price a sort or a scan at 10^10, which would put every statement over
-- jit_above_cost: compiling it (tens of ms) would cost more than the claim.
set jit = off
as $$
declare
    v_now timestamptz := clock_timestamp();
    v_expires timestamptz;
    v_tenant_ids uuid[];
    v_task_ids uuid[];
    v_run record;
    v_tenants integer := 0;
    v_max_recoveries integer;
    v_context uuid := keel.current_tenant();
begin
    perform keel.refuse_acting_for_none(v_context, 'Claim again in a transaction of its own.');
    v_expires := keel.check_lease_request(p_owner, p_lease, v_now);
    perform keel.check_claim_limit(p_limit);
    v_max_recoveries := keel.max_recovery_attempts();

    -- Only this statement sees and locks rows of every tenant (policies tasks_claim_scan
    -- and tasks_claim_lock); the flag is off again before anything is written.
    perform keel.set_claim_scan(true);
    select
        array_agg(c.tenant_id order by c.wake_at, c.tenant_id, c.task_id),
        array_agg(c.task_id order by c.wake_at, c.tenant_id, c.task_id)
    into v_tenant_ids, v_task_ids
    from (
        select t.tenant_id, t.task_id, t.wake_at
        from keel.tasks as t
        where t.wake_at <= v_now
            and (t.lease_expires_at is null or t.lease_expires_at <= v_now)
            and (p_workflow is null or t.workflow = p_workflow)
            -- A lease that expired unreleased as often as allowed: the recoverer's to fail.
            and (t.lease_owner is null or t.recovery_attempts < v_max_recoveries)
            -- A transaction that already acts for a tenant claims only that tenant's tasks.
            and (v_context is null or t.tenant_id = v_context)
        order by t.wake_at
        limit p_limit
        for update skip locked
    ) as c;
    perform keel.set_claim_scan(false);
    if v_task_ids is null then
        return;  -- nothing due, or every due task is locked by someone else
    end if;

    -- The leases, oldest first: one statement (keel.claim_locked_tasks) per run of tasks of
    -- one tenant in that order (one run when one tenant holds them all, as in every claim
    -- of one task), each in its tenant's context (the update's row-level security).
    if v_tenant_ids[1] = all(v_tenant_ids) then
        v_tenants := 1;
        perform keel.set_tenant_context(v_tenant_ids[1]);
        return query
        select c.*
        from keel.claim_locked_tasks(v_tenant_ids[1], v_task_ids, p_owner, v_now, v_expires) as c
        order by array_position(v_task_ids, c.task_id);
        return;
    end if;
    v_tenants := (select count(distinct c.tenant_id) from unnest(v_tenant_ids) as c (tenant_id));
    for v_run in
        select r.tenant_id, array_agg(r.task_id order by r.n) as task_ids
        from (
            select c.tenant_id, c.task_id, c.n,
                c.n - row_number() over (partition by c.tenant_id order by c.n) as run
            from unnest(v_tenant_ids, v_task_ids) with ordinality as c (tenant_id, task_id, n)
        ) as r
        group by r.tenant_id, r.run
        order by min(r.n)
    loop
        perform keel.set_tenant_context(v_run.tenant_id);
        return query
        select c.*
        from keel.claim_locked_tasks(v_run.tenant_id, v_run.task_ids, p_owner, v_now, v_expires) as c
        order by array_position(v_run.task_ids, c.task_id);
    end loop;
    if v_tenants > 1 then
        -- Tasks of several tenants: the transaction acts for none of them from now on
        -- (the nil uuid, which keel.require_tenant refuses and no row carries).
        perform keel.set_tenant_context(keel.no_tenant());
    end if;
end;
$$;

comment on function keel.claim_next_tasks(text, integer, interval, text) is
'Leases up to p_limit (1 to settings.max_batch_items) of the tasks of any tenant that have been due longest (wake_at <= now, no valid lease), optionally of one workflow, oldest first, each with its next fencing token. Rows locked by other transactions are skipped, so it returns tasks whenever unlocked due tasks exist; concurrent claimers never wait on or share a task. In a transaction that already has a tenant context it claims only that tenant''s tasks. Otherwise, when every claimed task is of one tenant, that tenant becomes the transaction''s context; after tasks of several tenants the transaction acts for none (later calls in it raise tenant_context_mismatch). A task whose lease expired unreleased settings.max_recovery_attempts times is not offered again: keel.recover_stale_tasks fails it. Returns no row when nothing claimable is due.';
