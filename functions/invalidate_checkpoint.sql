-- Recovery points (G8): mark a checkpoint unusable, fenced by the task lease (G5).
create or replace function keel.invalidate_checkpoint(
    p_tenant_id uuid,
    p_checkpoint_id uuid,
    p_fencing_token bigint
)
returns keel.checkpoints
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_now timestamptz := clock_timestamp();
    v_task_id uuid;
    v_checkpoint keel.checkpoints;
begin
    perform keel.require_tenant(p_tenant_id);
    select c.task_id into v_task_id
    from keel.checkpoints as c
    where c.tenant_id = p_tenant_id and c.checkpoint_id = p_checkpoint_id;
    if not found then
        raise exception using
            errcode = '42K12',
            message = format('checkpoint %s not found', p_checkpoint_id);
    end if;
    perform keel.assert_lease(keel.lock_task(p_tenant_id, v_task_id, 'share'), p_fencing_token, v_now);
    update keel.checkpoints as c
    set status = 'invalid'
    where c.tenant_id = p_tenant_id and c.checkpoint_id = p_checkpoint_id
    returning c.* into v_checkpoint;
    return v_checkpoint;
end;
$$;

comment on function keel.invalidate_checkpoint(uuid, uuid, bigint) is
'Marks a checkpoint invalid (a resuming worker found it unusable): keel.latest_checkpoint skips it from then on (G8). Fenced by the task lease (lease_lost, 55K03); checkpoint_not_found (42K12).';
