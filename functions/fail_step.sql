-- Durable steps (G8): store a step's error, fenced by the task lease (G5).
create or replace function keel.fail_step(
    p_tenant_id uuid,
    p_task_id uuid,
    p_step_key text,
    p_fencing_token bigint,
    p_error jsonb,
    p_retryable boolean default false,
    p_retry_after interval default null,
    p_repairs integer default 0
)
returns keel.step_attempts
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_state text := case when p_retryable then 'retryable' else 'failed' end;
begin
    perform keel.require_tenant(p_tenant_id);
    if p_error is null then
        raise exception using errcode = '22K01', message = 'an error description is required';
    end if;
    return keel.finish_step(
        p_tenant_id, p_task_id, p_step_key, p_fencing_token, v_state, null, p_error,
        p_retry_after, p_repairs
    );
end;
$$;

comment on function keel.fail_step(uuid, uuid, text, bigint, jsonb, boolean, interval, integer) is
'Stores the error of the step''s open attempt (G8). Not retryable: final, keel.begin_step returns it as failed. Retryable: the next keel.begin_step with the same input opens another attempt, not before p_retry_after has passed. Fenced and checked like keel.complete_step.';
