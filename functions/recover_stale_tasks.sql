-- Leases with fencing (G5): the recoverer. Every task of any tenant whose lease expired
-- unreleased (its worker died or stalled) is taken over, recorded and made due again, up
-- to settings.max_recovery_attempts times; the next time it fails (RECOVERY_EXHAUSTED).
-- A task is "running" while its lease is unexpired: a live lease is never touched.
-- The cross-tenant part is keel.lock_task_to_recover (replaced on Citus); each task is
-- then handled inside its own tenant's context by keel.recover_locked_task.
-- agentkeel:allow citus.set_local_autocommit (on PostgreSQL its SET LOCALs hold in autocommit too; on Citus the recoverer is replaced with keel.lock_task_to_recover, by the candidate scan of CITUS.md (b) 1)
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
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
    v_now timestamptz := clock_timestamp();
    v_context uuid := keel.current_tenant();  -- verified, or null: never a leftover
    v_max integer := p_max_attempts;
    v_stale keel.tasks;
    v_after timestamptz := '-infinity';
    v_task keel.tasks;
    v_done integer := 0;
begin
    perform keel.check_claim_limit(p_limit);
    perform keel.check_actor(p_actor);
    perform keel.refuse_acting_for_none(v_context, 'Recover in a transaction of its own.');
    -- A caller may ask for fewer recoveries than the setting, never more: claims stop
    -- offering a task at the setting, and no worker decides that for every tenant.
    v_max := least(coalesce(v_max, keel.max_recovery_attempts()), keel.max_recovery_attempts());
    if v_max < 0 then
        raise exception using
            errcode = '22K01',
            message = format('max recovery attempts must be 0 or more, not %s', v_max);
    end if;

    while v_done < p_limit loop
        v_stale := keel.lock_task_to_recover(v_now, p_workflow, v_after, v_context);
        exit when v_stale.task_id is null;
        v_after := v_stale.lease_expires_at;
        -- The stale task's tenant becomes the context for its takeover.
        perform keel.set_tenant_context(v_stale.tenant_id);
        v_task := keel.recover_locked_task(v_stale, v_now, v_max, p_actor);
        v_done := v_done + 1;
        return query select
            v_task.tenant_id,
            v_task.task_id,
            case when v_task.recovery_attempts > v_stale.recovery_attempts
                then 'recovered' else 'exhausted' end,
            v_task.state,
            v_task.recovery_attempts,
            v_task.fencing_token,
            v_stale.lease_owner,
            v_stale.lease_expires_at;
    end loop;

    -- The caller's own verified context, as it was; after taking tasks over without one,
    -- the transaction acts for no tenant (the nil uuid, refused by keel.require_tenant).
    if v_context is not null or v_done = 0 then
        perform keel.set_tenant_context(v_context);
    else
        perform keel.set_tenant_context(keel.no_tenant());
    end if;
end;
$$;

comment on function keel.recover_stale_tasks(integer, text, text, integer) is
'The recoverer (G5): takes over up to p_limit (1 to settings.max_batch_items) tasks of any tenant (of the transaction''s tenant when it has a context) whose lease expired unreleased, oldest expiry first, optionally of one workflow; rows locked by other transactions are skipped, so one tenant''s locks never stall another''s recovery. Each takeover increments the fencing token (the dead worker''s late writes get lease_lost) and the state_version, and writes one event: RECOVERED (outcome recovered: the task is unleased and due now, its state kept, recovery_attempts + 1) or, once recovery_attempts has reached p_max_attempts (settings.max_recovery_attempts when null or larger), RECOVERY_EXHAUSTED (outcome exhausted: the task enters settings.recovery_failed_state if its workflow version declares it, else keeps its state; unleased, never due). An unexpired lease is never touched. p_actor is stored as the events'' claimed_actor. Returns one row per task handled.';
