-- Durable steps (G8): close the attempt a lost lease left open. Its worker lost the lease
-- before closing it; the new lease holder closes it as a retryable failure, by the one
-- finishing path (keel.finish_operation), and marks the attempt abandoned, so that
-- keel.begin_step can open the next one. The caller holds the task's lease and has locked
-- the operation and the attempt.
create or replace function keel.abandon_step_attempt(
    p_operation keel.operations,
    p_step_key text,
    p_attempt integer,
    p_fencing_token bigint,
    p_now timestamptz
)
returns void
language plpgsql
volatile
-- No SET search_path: granted to no role, it runs in its caller's pinned one.
as $$
begin
    perform keel.finish_operation(
        p_operation.tenant_id, p_operation.operation_id, p_fencing_token, 'retryable', null,
        jsonb_build_object(
            'reason', 'abandoned',
            'detail', format(
                'attempt %s was opened under lease token %s, which was lost',
                p_operation.attempts, p_operation.reserved_fencing_token
            )
        ),
        null
    );
    update keel.step_attempts as a
    set status = 'abandoned', finished_at = p_now
    where a.tenant_id = p_operation.tenant_id and a.task_id = p_operation.task_id
        and a.step_key = p_step_key and a.attempt = p_attempt
        and a.status = 'running';
end;
$$;

comment on function keel.abandon_step_attempt(keel.operations, text, integer, bigint, timestamptz) is
'Closes attempt p_attempt of step p_step_key, opened under a lease that was lost before it finished: its operation becomes retryable with error {reason: abandoned} (keel.finish_operation, fenced by p_fencing_token, the current lease) and the attempt abandoned. Shared by keel.begin_step; not granted to any role.';
