-- Durable steps (G8): close the open attempt of a step, fenced (G5), through the one
-- finishing path of operations (G2, G9).
create or replace function keel.finish_step(
    p_tenant_id uuid,
    p_task_id uuid,
    p_step_key text,
    p_fencing_token bigint,
    p_state text,
    p_result jsonb,
    p_error jsonb,
    p_retry_after interval,
    p_repairs integer
)
returns keel.step_attempts
language plpgsql
volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    v_now timestamptz := clock_timestamp();
    v_operation_id uuid;
    v_op keel.operations;
    v_status text;
    v_next_retry_at timestamptz;
    v_attempt keel.step_attempts;
begin
    perform keel.require_tenant(p_tenant_id);
    if p_repairs is null or p_repairs < 0 then
        raise exception using errcode = '22K01', message = 'repair count must be zero or more';
    end if;
    if p_retry_after is not null then
        if p_state <> 'retryable' then
            raise exception using
                errcode = '22K01',
                message = 'a retry delay is only for a retryable failure';
        end if;
        v_next_retry_at := keel.interval_end('retry delay', p_retry_after, v_now, interval '366 days');
    end if;
    v_status := case when p_state = 'succeeded' then 'succeeded' else 'failed' end;

    select o.operation_id into v_operation_id
    from keel.operations as o
    where o.tenant_id = p_tenant_id
        and o.idempotency_key = keel.step_operation_key(p_task_id, p_step_key);
    if not found then
        raise exception using
            errcode = '42K10',
            message = format('step %s of task %s not found', p_step_key, p_task_id),
            hint = 'Begin the step with keel.begin_step first.';
    end if;

    -- Fenced (lease_lost), redacted (payload_rejected), refused when not open
    -- (operation_not_reserved): the same checks as for every operation.
    v_op := keel.finish_operation(
        p_tenant_id, v_operation_id, p_fencing_token, p_state, p_result, p_error, null
    );

    update keel.step_attempts as a
    set
        status = v_status,
        retryable = (p_state = 'retryable'),
        next_retry_at = v_next_retry_at,
        repair_count = p_repairs,
        finished_at = v_now
    where a.tenant_id = p_tenant_id and a.task_id = p_task_id and a.step_key = p_step_key
        and a.attempt = v_op.attempts and a.status = 'running'
    returning a.* into v_attempt;
    if not found then
        raise exception using
            errcode = '42K10',
            message = format('step %s of task %s has no open attempt', p_step_key, p_task_id),
            detail = format(
                'Operation %s was reserved outside keel.begin_step.', v_operation_id
            ),
            hint = 'Begin the step with keel.begin_step.';
    end if;
    return v_attempt;
end;
$$;

comment on function keel.finish_step(uuid, uuid, text, bigint, text, jsonb, jsonb, interval, integer) is
'Shared body of keel.complete_step and keel.fail_step: finishes the step''s operation by keel.finish_operation (fenced, payload-checked) and closes its open attempt. Not granted to any role.';
