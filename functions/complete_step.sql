-- Durable steps (G8): store a step's result, fenced by the task lease (G5).
create or replace function keel.complete_step(
    p_tenant_id uuid,
    p_task_id uuid,
    p_step_key text,
    p_fencing_token bigint,
    p_result jsonb,
    p_repairs integer default 0
)
returns keel.step_attempts
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    perform keel.require_tenant(p_tenant_id);
    if p_result is null then
        raise exception using
            errcode = '22K01',
            message = 'a result is required',
            hint = 'Pass ''{}''::jsonb when the step has no result worth keeping.';
    end if;
    return keel.finish_step(
        p_tenant_id, p_task_id, p_step_key, p_fencing_token, 'succeeded', p_result, null, null,
        p_repairs
    );
end;
$$;

comment on function keel.complete_step(uuid, uuid, text, bigint, jsonb, integer) is
'Stores the result of the step''s open attempt (G8): later keel.begin_step calls with the same input hash reuse it. Fenced by the task lease (lease_lost, 55K03); the result passes keel.check_payload (G9); step_not_found (42K10) before keel.begin_step; operation_not_reserved (55K05) if the attempt is already closed.';
