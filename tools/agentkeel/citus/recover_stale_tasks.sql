-- Leases with fencing (G5), on Citus: the recoverer, over every tenant.
-- agentkeel:allow citus.tenant_filter (the candidate scan reads every tenant, without a lock)
-- agentkeel:allow citus.set_local_autocommit (the nil context it sets at the end matters only to later statements of a transaction block; in autocommit the transaction ends with the call)
-- Installed by `agentkeel distribute` in place of functions/recover_stale_tasks.sql, whose
-- FOR UPDATE SKIP LOCKED over every tenant (keel.lock_task_to_recover) Citus refuses, and
-- which would reach the workers as keel_owner. Callers do not change.
-- SECURITY INVOKER: an unlocked candidate scan of expired leases as the worker login
-- (policy tasks_worker_scan), then keel.recover_stale_task for each candidate on its
-- tenant's node, which locks it with SKIP LOCKED and rechecks that its lease expired.
-- In a transaction that acts for a tenant, only that tenant's tasks are recovered.
create or replace function keel.recover_stale_tasks(
    p_limit integer default 100,
    p_actor text default null,
    p_workflow text default null,
    p_max_attempts integer default null
)
returns table (
    tenant_id uuid,
    task_id uuid,
    outcome text,
    state text,
    recovery_attempts integer,
    fencing_token bigint,
    previous_owner text,
    lease_expired_at timestamptz
)
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
-- The scan's shard queries go over one connection per worker, the one Citus keeps open
-- between statements: a pool of new connections per call (the default, up to 16 per
-- worker, each with its TLS handshake) cost more than the scan.
set "citus.max_adaptive_executor_pool_size" = 1
as $$
#variable_conflict use_column
declare
    v_batch constant integer := 32;
    v_now timestamptz := clock_timestamp();
    v_context uuid := keel.current_tenant();
    v_tenants uuid[];
    v_tasks uuid[];
    v_expiries timestamptz[];
    -- Candidates in lease_expires_at order only, the expiry index's order: rounds as in
    -- the Citus keel.claim_next_tasks, the rest of a full round's last tie group next.
    v_after timestamptz := '-infinity';
    v_tie timestamptz;
    v_tried text[] := '{}';
    v_count integer;
    v_row record;
    v_done integer := 0;
    -- As in the Citus keel.claim_next_tasks: a tenant with v_batch candidates that could
    -- not be taken over (locked by an open transaction, each try a round trip) is passed
    -- over for the rest of the call.
    v_passed uuid[] := '{}';
    v_failures jsonb := '{}';
    v_taken boolean;
begin
    perform keel.check_claim_limit(p_limit);
    perform keel.check_actor(p_actor);
    perform keel.refuse_acting_for_none(v_context, 'Recover in a transaction of its own.');
    loop
        perform keel.set_claim_scan(true);
        select
            array_agg(c.tenant_id order by c.lease_expires_at),
            array_agg(c.task_id order by c.lease_expires_at),
            array_agg(c.lease_expires_at order by c.lease_expires_at)
        into v_tenants, v_tasks, v_expiries
        from (
            select t.tenant_id, t.task_id, t.lease_expires_at
            from keel.tasks as t
            where t.lease_owner is not null
                and t.lease_expires_at <= v_now
                and (p_workflow is null or t.workflow = p_workflow)
                and (v_context is null or t.tenant_id = v_context)
                and t.tenant_id <> all(v_passed)
                and (
                    (v_tie is null and t.lease_expires_at > v_after)
                    or (
                        t.lease_expires_at = v_tie
                        and t.tenant_id::text || '/' || t.task_id::text <> all(v_tried)
                    )
                )
            order by t.lease_expires_at
            limit case when v_tie is null then v_batch end
        ) as c;
        perform keel.set_claim_scan(false);
        v_count := coalesce(array_length(v_tenants, 1), 0);
        for i in 1 .. v_count loop
            continue when v_tenants[i] = any(v_passed);
            v_tried := v_tried || (v_tenants[i]::text || '/' || v_tasks[i]::text);
            v_taken := false;
            for v_row in
                select r.*
                from keel.recover_stale_task(v_tenants[i], v_tasks[i], p_actor, p_max_attempts) as r
            loop
                tenant_id := v_row.tenant_id;
                task_id := v_row.task_id;
                outcome := v_row.outcome;
                state := v_row.state;
                recovery_attempts := v_row.recovery_attempts;
                fencing_token := v_row.fencing_token;
                previous_owner := v_row.previous_owner;
                lease_expired_at := v_row.lease_expired_at;
                return next;
                v_done := v_done + 1;
                v_taken := true;
            end loop;
            if not v_taken then
                v_failures := jsonb_set(
                    v_failures,
                    array[v_tenants[i]::text],
                    to_jsonb(coalesce((v_failures ->> v_tenants[i]::text)::integer, 0) + 1)
                );
                if (v_failures ->> v_tenants[i]::text)::integer >= v_batch then
                    v_passed := v_passed || v_tenants[i];
                end if;
            end if;
            exit when v_done >= p_limit;
        end loop;
        exit when v_done >= p_limit;
        if v_tie is not null then
            v_after := v_tie;
            v_tie := null;
            v_tried := '{}';
        elsif v_count < v_batch then
            exit;
        else
            v_tie := v_expiries[v_count];
        end if;
    end loop;
    -- As on PostgreSQL: after taking tasks over, a transaction that had no context acts
    -- for none (the nil uuid); a context the caller had stays.
    if v_context is null and v_done > 0 then
        execute format('set local keel.tenant_id = %L', keel.no_tenant());
        perform keel.bind_tenant_context();
    end if;
end;
$$;

comment on function keel.recover_stale_tasks(integer, text, text, integer) is
'Citus variant (installed by agentkeel distribute; SECURITY INVOKER): the recoverer (G5). Takes over up to p_limit (1 to settings.max_batch_items) tasks of any tenant (of the transaction''s tenant when it has a context) whose lease expired unreleased, oldest expiry first, optionally of one workflow, by an unlocked candidate scan as the worker login and then keel.recover_stale_task for each candidate on its tenant''s node; rows locked by other transactions are skipped, and a tenant with 32 candidates that could not be taken over in one call is passed over for the rest of that call. Each takeover is what keel.recover_stale_task does: one RECOVERED or RECOVERY_EXHAUSTED event. Returns one row per task handled.';
