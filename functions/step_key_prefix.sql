-- Durable steps (G8): the key space of the steps in keel.operations, defined once. Every
-- step's idempotency key begins with step:, and a task's steps with step:<task id>:
-- (keel.step_operation_key); keel.reserve_operation keeps the space to the steps.
create or replace function keel.step_key_prefix(p_task_id uuid default null)
returns text
language sql
immutable
parallel safe
return 'step:' || coalesce(p_task_id::text || ':', '');

comment on function keel.step_key_prefix(uuid) is
'The prefix of the idempotency keys of the durable steps of task p_task_id (step:<task id>:), or, with no task, of every step (step:). Used by keel.step_operation_key and keel.reserve_operation.';
