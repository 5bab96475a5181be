-- Idempotency (G2): a key used again must name the same operation. The stored operation
-- and the new request are compared field by field; any difference is a conflict, and the
-- stored operation is left as it is.
create or replace function keel.check_operation_replay(
    p_operation keel.operations,
    p_action text,
    p_input_hash text,
    p_task_id uuid
)
returns void
language plpgsql
immutable
-- No SET search_path: granted to no role, it runs in its caller's pinned one.
as $$
declare
    v_differs text[];
begin
    if p_operation.input_hash <> p_input_hash then
        v_differs := v_differs || 'input_hash'::text;
    end if;
    if p_operation.action <> p_action then
        v_differs := v_differs || 'action'::text;
    end if;
    if p_operation.task_id is distinct from p_task_id then
        v_differs := v_differs || 'task_id'::text;
    end if;
    if v_differs is not null then
        raise exception using
            errcode = '23K01',
            message = format(
                'idempotency key %s was already used for a different operation',
                p_operation.idempotency_key
            ),
            detail = format(
                'Stored operation %s differs in: %s. It was left unchanged.',
                p_operation.operation_id, array_to_string(v_differs, ', ')
            ),
            hint = 'Use a new idempotency key for new input; replay a key only with the exact same input.';
    end if;
end;
$$;

comment on function keel.check_operation_replay(keel.operations, text, text, uuid) is
'Raises idempotency_conflict (23K01), naming the fields that differ (input_hash, action, task_id), unless the stored operation p_operation has the given action, input hash and task. Shared by keel.reserve_operation; not granted to any role.';
