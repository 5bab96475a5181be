-- Durable steps (G8): the one derivation of a step's idempotency key. A step is the
-- operation (G2) with this key, so its input hash, outcome and replay are the G2 rules.
-- agentkeel:requires functions/step_key_prefix.sql
create or replace function keel.step_operation_key(p_task_id uuid, p_step_key text)
returns text
language sql
immutable
parallel safe
return keel.step_key_prefix(p_task_id) || p_step_key;

comment on function keel.step_operation_key(uuid, text) is
'The idempotency key of step p_step_key of task p_task_id in keel.operations: step:<task id>:<step key> (keel.step_key_prefix). Used by keel.begin_step and keel.finish_step, and nowhere else.';
