-- Leases with fencing (G5): recover one named task of one tenant if its lease expired
-- unreleased, else nothing. The per-tenant half of the recoverer on Citus (the variant of
-- keel.recover_stale_tasks finds candidates with an unlocked scan, then calls this for
-- each one, on the node that holds its tenant); a task someone else holds locked, or
-- whose lease was renewed or released meanwhile, is skipped, never waited on.
-- agentkeel:allow citus.require_tenant (it sets the tenant it acts for, then keel.adopt_tenant checks it: see the body)
-- It acts for p_tenant_id only while it runs, like keel.claim_due_task.
create or replace function keel.recover_stale_task(
    p_tenant_id uuid,
    p_task_id uuid,
    p_actor text default null,
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
    v_had_context boolean := keel.current_tenant() is not null;
    -- Fewer recoveries than the setting may be asked for, never more (as in
    -- keel.recover_stale_tasks).
    v_max integer := least(
        coalesce(p_max_attempts, keel.max_recovery_attempts()), keel.max_recovery_attempts()
    );
    v_stale keel.tasks;
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
    perform keel.check_actor(p_actor);
    if v_max < 0 then
        raise exception using
            errcode = '22K01',
            message = format('max recovery attempts must be 0 or more, not %s', v_max);
    end if;
    select t.* into v_stale
    from keel.tasks as t
    where t.tenant_id = p_tenant_id
        and t.task_id = p_task_id
        and t.lease_owner is not null
        and t.lease_expires_at <= v_now
    for update skip locked;
    if found then
        v_task := keel.recover_locked_task(v_stale, v_now, v_max, p_actor);
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
    end if;
    if not v_had_context then
        perform keel.set_tenant_context(null);
    end if;
end;
$$;

comment on function keel.recover_stale_task(uuid, uuid, text, integer) is
'Takes over the task if its lease expired unreleased, exactly as keel.recover_stale_tasks does for each task it handles (RECOVERED or RECOVERY_EXHAUSTED, one event), and returns that row; returns no row when the lease is valid, released, or another transaction holds the task locked, and never waits. A transaction that had no tenant context has none afterwards. The per-tenant step of the Citus variant of keel.recover_stale_tasks (G5).';
