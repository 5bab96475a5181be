-- Durable steps (G8): reuse a completed step with the same input, or open its next attempt.
create or replace function keel.begin_step(
    p_tenant_id uuid,
    p_task_id uuid,
    p_step_key text,
    p_input_hash text,
    p_fencing_token bigint,
    p_retention interval default '7 days'
)
returns table (
    outcome text,
    operation_id uuid,
    attempt integer,
    result jsonb,
    error jsonb,
    next_retry_at timestamptz
)
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
    v_now timestamptz := clock_timestamp();
    v_key text;
    v_task keel.tasks;
    v_op keel.operations;
    v_last keel.step_attempts;
    v_reservation record;
begin
    perform keel.require_tenant(p_tenant_id);
    if p_task_id is null then
        raise exception using errcode = '22K01', message = 'a step belongs to a task: task id is required';
    end if;
    if p_step_key is null or char_length(p_step_key) not between 1 and 200 then
        raise exception using errcode = '22K01', message = 'step key must be 1 to 200 characters';
    end if;
    v_key := keel.step_operation_key(p_task_id, p_step_key);

    -- FOR UPDATE: a reuse appends an event under the task's event counter, and no claim
    -- can move the lease until this commits (G5). Lock order: task, operation, attempts.
    v_task := keel.lock_task(p_tenant_id, p_task_id);
    perform keel.assert_lease(v_task, p_fencing_token, v_now);

    select o.* into v_op
    from keel.operations as o
    where o.tenant_id = p_tenant_id and o.idempotency_key = v_key
    for update;
    -- Same input only: another input hash is refused by keel.reserve_operation below.
    if found and v_op.input_hash = p_input_hash then
        select a.* into v_last
        from keel.step_attempts as a
        where a.tenant_id = p_tenant_id and a.task_id = p_task_id and a.step_key = p_step_key
        order by a.attempt desc
        limit 1
        for update;
        if v_op.state = 'retryable' and v_last.next_retry_at > v_now then
            return query select
                'retry_later'::text, v_op.operation_id, v_last.attempt, null::jsonb, v_op.error,
                v_last.next_retry_at;
            return;
        end if;
        if v_op.state = 'reserved' and v_op.reserved_fencing_token < p_fencing_token then
            -- Its worker lost the lease before closing the attempt: closed, the next opens.
            perform keel.abandon_step_attempt(v_op, p_step_key, v_last.attempt, p_fencing_token, v_now);
        end if;
    end if;

    -- The G2 mechanism, not a copy of it: same key and input replay the stored outcome,
    -- another input hash raises idempotency_conflict (23K01) and changes nothing.
    select r.* into v_reservation
    from keel.reserve_operation(
        p_tenant_id, p_task_id, v_key, 'step', p_input_hash, p_fencing_token, p_retention
    ) as r;

    if v_reservation.outcome = 'succeeded' then
        -- G8: reused, not run again, and recorded. An event that is not a state change:
        -- it takes the next seq but leaves state and state_version as they are.
        update keel.tasks as t
        set last_event_seq = v_task.last_event_seq + 1, updated_at = v_now
        where t.tenant_id = p_tenant_id and t.task_id = p_task_id
        returning t.* into v_task;
        perform keel.append_event(
            v_task, 'STEP_RESULT_REUSED', v_task.state, v_now, p_fencing_token,
            jsonb_build_object(
                'step_key', p_step_key,
                'input_hash', p_input_hash,
                'operation_id', v_reservation.operation_id,
                'attempts', v_reservation.attempts
            )
        );
        return query select
            'reused'::text, v_reservation.operation_id, v_reservation.attempts,
            v_reservation.result, null::jsonb, null::timestamptz;
    elsif v_reservation.outcome = 'reserved' then
        -- A new attempt: within the task's quota, or nothing (the reservation with it).
        perform keel.check_quota(p_tenant_id, p_task_id, 'max_task_step_attempts', 1);
        insert into keel.step_attempts (
            tenant_id, task_id, step_key, attempt, operation_id, input_hash, status,
            fencing_token, started_at
        )
        values (
            p_tenant_id, p_task_id, p_step_key, v_reservation.attempts,
            v_reservation.operation_id, p_input_hash, 'running', p_fencing_token, v_now
        );
        return query select
            'started'::text, v_reservation.operation_id, v_reservation.attempts, null::jsonb,
            null::jsonb, null::timestamptz;
    else
        -- in_progress (this lease opened it and has not closed it) or failed (final).
        return query select
            v_reservation.outcome, v_reservation.operation_id, v_reservation.attempts,
            null::jsonb, v_reservation.error, null::timestamptz;
    end if;
end;
$$;

comment on function keel.begin_step(uuid, uuid, text, text, bigint, interval) is
'Begins step p_step_key of a leased task (G8). outcome: reused (a completed step with the same input hash: its stored result, not run again, and a STEP_RESULT_REUSED event), started (attempt n+1 is open: run it, then keel.complete_step or keel.fail_step), in_progress (this lease opened it already), retry_later (failed retryably; not before next_retry_at), failed (final; the stored error). An attempt left open by a lease that was lost is closed as abandoned and the next one opens. A different input hash for the same step raises idempotency_conflict (23K01) and changes nothing: the step is the operation keel.step_operation_key(task, step) under the G2 rules. Fenced by the task lease (lease_lost, 55K03).';
