-- Leases with fencing (G5), on Citus: claim the next due tasks of any tenant, up to a limit.
-- agentkeel:allow citus.tenant_filter (the candidate scan reads every tenant, without a lock)
-- Installed by `agentkeel distribute` in place of functions/claim_next_tasks.sql, whose
-- single FOR UPDATE SKIP LOCKED over every tenant is a multi-shard row lock, which Citus
-- refuses, and which, as a SECURITY DEFINER function running on the coordinator, would
-- reach the workers as its owner (keel_owner may not log in on a cluster: no login may
-- ever act there as the owner of the tables). Callers do not change: same name,
-- arguments, result; keel.claim_next_task (a limit of one) calls it unchanged.
-- SECURITY INVOKER: everything it does on the workers runs as the caller's own login.
--   1. An unlocked candidate scan over every tenant, oldest wake_at first, a batch at a
--      time (keyset pagination): a multi-shard SELECT, as the worker login, which reads
--      every tenant's tasks while keel.scan_all_tenants is on (policy tasks_worker_scan).
--   2. For each candidate, keel.claim_due_task on the node that holds its tenant (Citus
--      delegates it there by its tenant argument): FOR UPDATE SKIP LOCKED within that one
--      tenant, rechecking that the task is still due and unleased.
-- A candidate someone else has locked or claimed meanwhile is skipped, never waited on;
-- the next batch is scanned until p_limit are claimed or none is left, so a tenant holding
-- locks on any number of its due rows cannot keep the claim from another tenant's task.
-- Each try is a round trip to a worker, so a tenant with v_batch candidates that could not
-- be claimed is passed over for the rest of the call, once its node has claimed the
-- tenant's longest-due task past them, if one is not locked (keel.claim_due_task without a
-- task: SKIP LOCKED there). An open transaction that locks 10,000 of one tenant's due tasks
-- cost every claim 10,000 round trips; now at most v_batch and one scan on that node.
create or replace function keel.claim_next_tasks(
    p_owner text,
    p_limit integer default 100,
    p_lease interval default '30 seconds',
    p_workflow text default null
)
returns setof keel.tasks
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
-- The scan's shard queries go over one connection per worker, the one Citus keeps open
-- between statements: a pool of new connections per call (the default, up to 16 per
-- worker, each with its TLS handshake) cost more than the scan.
set "citus.max_adaptive_executor_pool_size" = 1
as $$
declare
    v_batch constant integer := 32;
    v_now timestamptz := clock_timestamp();
    v_tenants uuid[];
    v_tasks uuid[];
    v_wakes timestamptz[];
    -- Candidates come in wake_at order only: the due index's order, so a scan never sorts
    -- (many tasks enqueued in one transaction share one wake_at). A round reads the next
    -- v_batch after v_after; when a full round claimed too little, the next one reads the
    -- rest of its last wake_at's tie group (v_tie), minus what was tried, then moves on.
    v_after timestamptz := '-infinity';
    v_tie timestamptz;
    v_tried text[] := '{}';
    v_task keel.tasks;
    v_count integer;
    v_claimed integer := 0;
    v_claimed_tenant uuid;
    v_claimed_tenants integer := 0;
    -- Tenants passed over for the rest of the call, and each tenant's failed tries so far.
    v_passed uuid[] := '{}';
    v_failures jsonb := '{}';
    v_max_recoveries integer := keel.max_recovery_attempts();
    v_context uuid := keel.current_tenant();
begin
    perform keel.check_lease_request(p_owner, p_lease, v_now);
    perform keel.check_claim_limit(p_limit);
    perform keel.refuse_acting_for_none(v_context, 'Claim again in a transaction of its own.');
    loop
        perform keel.set_claim_scan(true);
        select
            array_agg(c.tenant_id order by c.wake_at),
            array_agg(c.task_id order by c.wake_at),
            array_agg(c.wake_at order by c.wake_at)
        into v_tenants, v_tasks, v_wakes
        from (
            select t.tenant_id, t.task_id, t.wake_at
            from keel.tasks as t
            where t.wake_at <= v_now
                and (t.lease_expires_at is null or t.lease_expires_at <= v_now)
                and (p_workflow is null or t.workflow = p_workflow)
                and (t.lease_owner is null or t.recovery_attempts < v_max_recoveries)
                -- A transaction that already acts for a tenant claims only its tasks.
                and (v_context is null or t.tenant_id = v_context)
                and t.tenant_id <> all(v_passed)
                and (
                    (v_tie is null and t.wake_at > v_after)
                    or (
                        t.wake_at = v_tie
                        and t.tenant_id::text || '/' || t.task_id::text <> all(v_tried)
                    )
                )
            order by t.wake_at
            limit case when v_tie is null then v_batch end
        ) as c;
        perform keel.set_claim_scan(false);
        v_count := coalesce(array_length(v_tenants, 1), 0);
        for v_i in 1 .. v_count loop
            continue when v_tenants[v_i] = any(v_passed);
            v_tried := v_tried || (v_tenants[v_i]::text || '/' || v_tasks[v_i]::text);
            select c.* into v_task
            from keel.claim_due_task(v_tenants[v_i], v_tasks[v_i], p_owner, p_lease, p_workflow) as c;
            if v_task.task_id is not null then
                return next v_task;
                v_claimed := v_claimed + 1;
                if v_tenants[v_i] is distinct from v_claimed_tenant then
                    v_claimed_tenant := v_tenants[v_i];
                    v_claimed_tenants := v_claimed_tenants + 1;
                end if;
                exit when v_claimed >= p_limit;
            else
                v_failures := jsonb_set(
                    v_failures,
                    array[v_tenants[v_i]::text],
                    to_jsonb(coalesce((v_failures ->> v_tenants[v_i]::text)::integer, 0) + 1)
                );
                if (v_failures ->> v_tenants[v_i]::text)::integer >= v_batch then
                    v_passed := v_passed || v_tenants[v_i];
                    -- Before passing it over, its node claims the tenant's longest-due
                    -- task that is not locked, past the ones the claim could not take
                    -- (SKIP LOCKED there): one task, so that locking some of its own
                    -- tasks never moves a tenant ahead of others' older ones.
                    select c.* into v_task
                    from keel.claim_due_task(v_tenants[v_i], null, p_owner, p_lease, p_workflow) as c;
                    if v_task.task_id is not null then
                        return next v_task;
                        v_claimed := v_claimed + 1;
                        if v_tenants[v_i] is distinct from v_claimed_tenant then
                            v_claimed_tenant := v_tenants[v_i];
                            v_claimed_tenants := v_claimed_tenants + 1;
                        end if;
                    end if;
                    exit when v_claimed >= p_limit;
                end if;
            end if;
        end loop;
        exit when v_claimed >= p_limit;
        if v_tie is not null then
            v_after := v_tie;  -- the tie group is done: on past it
            v_tie := null;
            v_tried := '{}';
        elsif v_count < v_batch then
            exit;  -- read everything due
        else
            v_tie := v_wakes[v_count];  -- the rest of the last wake_at's tasks next
        end if;
    end loop;
    -- As on PostgreSQL: one claimed tenant becomes the transaction's context; after
    -- several it acts for none (the nil uuid). A context the caller had stays.
    if v_context is null and v_claimed_tenants = 1 then
        execute format('set local keel.tenant_id = %L', v_claimed_tenant);
        perform keel.bind_tenant_context();
    elsif v_context is null and v_claimed_tenants > 1 then
        execute format('set local keel.tenant_id = %L', keel.no_tenant());
        perform keel.bind_tenant_context();
    end if;
end;
$$;

comment on function keel.claim_next_tasks(text, integer, interval, text) is
'Citus variant (installed by agentkeel distribute; SECURITY INVOKER): leases up to p_limit of the tasks of any tenant that have been due longest (wake_at <= now, no valid lease), optionally of one workflow, by an unlocked candidate scan over every tenant as the calling worker login and then keel.claim_due_task for each candidate, on its tenant''s node. Rows locked by other transactions are skipped, so it returns tasks whenever unlocked due tasks exist, and a tenant with 32 candidates that could not be claimed in one call is passed over for the rest of that call once its node has claimed that tenant''s longest-due unlocked task past them (each try is a round trip to a worker). In a transaction that already has a tenant context it claims only that tenant''s tasks; otherwise one claimed tenant becomes the context, and after several the transaction acts for none. Returns no row when nothing claimable is due.';
