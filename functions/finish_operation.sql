-- Idempotency (G2): record the outcome of a reserved operation, fenced (G5).
create or replace function keel.finish_operation(
    p_tenant_id uuid,
    p_operation_id uuid,
    p_fencing_token bigint,
    p_state text,
    p_result jsonb,
    p_error jsonb,
    p_provider_reference text
)
returns keel.operations
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_now timestamptz := clock_timestamp();
    v_task_id uuid;
    v_op keel.operations;
begin
    perform keel.require_tenant(p_tenant_id);
    if p_state not in ('succeeded', 'failed', 'retryable') then
        raise exception using
            errcode = '22K01',
            message = format('an operation cannot finish in state %s', p_state);
    end if;
    perform keel.check_payload('operation result', p_result, 'max_operation_result_bytes');
    perform keel.check_payload('operation error', p_error, 'max_operation_result_bytes');
    select o.task_id into v_task_id
    from keel.operations as o
    where o.tenant_id = p_tenant_id and o.operation_id = p_operation_id;
    if not found then
        raise exception using
            errcode = '42K05',
            message = format('operation %s not found', p_operation_id);
    end if;
    -- Lock order everywhere: task, then operation.
    if v_task_id is not null then
        -- FOR SHARE: a concurrent claim cannot move the lease until this commits (G5).
        perform keel.assert_lease(keel.lock_task(p_tenant_id, v_task_id, 'share'), p_fencing_token, v_now);
    elsif p_fencing_token is not null then
        raise exception using
            errcode = '22K01',
            message = format('operation %s has no task, so it takes no fencing token', p_operation_id);
    end if;

    select o.* into v_op
    from keel.operations as o
    where o.tenant_id = p_tenant_id and o.operation_id = p_operation_id
    for update;
    if v_op.state <> 'reserved' then
        raise exception using
            errcode = '55K05',
            message = format('operation %s is %s, not reserved', p_operation_id, v_op.state),
            hint = 'Replay keel.reserve_operation with the same key to read the stored outcome.';
    end if;

    update keel.operations as o
    set
        state = p_state,
        result = p_result,
        error = p_error,
        provider_reference = coalesce(p_provider_reference, o.provider_reference),
        completed_at = v_now,
        updated_at = v_now
    where o.tenant_id = p_tenant_id and o.operation_id = p_operation_id
    returning o.* into v_op;
    return v_op;
end;
$$;

comment on function keel.finish_operation(uuid, uuid, bigint, text, jsonb, jsonb, text) is
'Shared body of keel.complete_operation and keel.fail_operation: moves a reserved operation to p_state, fenced by the task lease.';
