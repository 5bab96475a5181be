-- Idempotency (G2): what a reservation is asked for, checked before anything is looked up:
-- the key, the action and the input hash within their lengths, and the steps' key space
-- (keel.step_key_prefix) kept to the steps: a step's key is reserved only for its own
-- task, under that task's lease, so nobody without the lease can take a step's key first
-- and keep the step from ever running.
create or replace function keel.check_operation_request(
    p_idempotency_key text,
    p_action text,
    p_input_hash text,
    p_task_id uuid,
    p_fencing_token bigint
)
returns void
language plpgsql
immutable
-- No SET search_path: granted to no role, it runs in its caller's pinned one.
as $$
begin
    if p_idempotency_key is null or char_length(p_idempotency_key) not between 1 and 255 then
        raise exception using
            errcode = '22K01',
            message = 'idempotency key must be 1 to 255 characters';
    end if;
    if p_action is null or char_length(p_action) not between 1 and 200 then
        raise exception using errcode = '22K01', message = 'action must be 1 to 200 characters';
    end if;
    if starts_with(p_idempotency_key, keel.step_key_prefix())
        and (
            p_task_id is null or p_fencing_token is null
            or not starts_with(p_idempotency_key, keel.step_key_prefix(p_task_id))
        ) then
        raise exception using
            errcode = '22K01',
            message = 'idempotency keys beginning with step: belong to the durable steps of the task they name',
            hint = 'Use keel.begin_step for a step, or another key for an operation.';
    end if;
    if p_input_hash is null or char_length(p_input_hash) not between 1 and 128 then
        raise exception using
            errcode = '22K01',
            message = 'input hash must be 1 to 128 characters',
            hint = 'Pass a digest of the operation input, e.g. the sha256 hex of its canonical JSON.';
    end if;
end;
$$;

comment on function keel.check_operation_request(text, text, text, uuid, bigint) is
'Raises invalid_argument (22K01) unless the idempotency key is 1 to 255 characters, the action 1 to 200, the input hash 1 to 128, and a key in the steps'' key space (keel.step_key_prefix) names the task p_task_id and comes with a fencing token. Shared by keel.reserve_operation; not granted to any role.';
