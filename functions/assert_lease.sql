-- The one fencing check (G5): every fenced write calls this before writing.
create or replace function keel.assert_lease(
    p_task keel.tasks,
    p_fencing_token bigint,
    p_now timestamptz
)
returns void
language plpgsql
stable
-- No SET search_path: granted to no role, it runs in its caller's pinned one.
as $$
begin
    if p_fencing_token is null then
        raise exception using
            errcode = '55K03',
            message = format('lease lost on task %s: no fencing token given', p_task.task_id),
            detail = 'This write is fenced: it must present the token returned by keel.claim_lease.',
            hint = 'Claim the task first, and pass the fencing token you were given.';
    end if;
    if p_task.lease_owner is null
        or p_task.fencing_token <> p_fencing_token
        or p_task.lease_expires_at <= p_now then
        raise exception using
            errcode = '55K03',
            message = format('lease lost on task %s', p_task.task_id),
            detail = case
                when p_task.fencing_token <> p_fencing_token then format(
                    'Token %s was presented; the current token is %s (the task was claimed again).',
                    p_fencing_token, p_task.fencing_token
                )
                when p_task.lease_owner is null then format(
                    'Token %s was presented, but the lease was released.', p_fencing_token
                )
                else format(
                    'Token %s expired at %s.', p_fencing_token, p_task.lease_expires_at
                )
            end,
            hint = 'Stop working on this task: its result would race another worker. Claim it again before writing.';
    end if;
end;
$$;

comment on function keel.assert_lease(keel.tasks, bigint, timestamptz) is
'Raises lease_lost (55K03) unless p_fencing_token is the task''s current, unexpired lease token. The single fencing check behind every fenced write (G5).';
