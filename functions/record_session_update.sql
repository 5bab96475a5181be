-- Sessions: record one step update (status / result / error) of a chat-loop session.
-- The rules, decided under the session row's lock against the step's latest applied
-- update (G3), so that they hold for writers in the same instant or concurrently:
--   completed and failed are terminal for a step;
--   a non-terminal update (running) never replaces a terminal one;
--   a terminal update replaces an earlier terminal one only with a higher attempt, so a
--   successful retry clears a failure and a failed re-run replaces a success;
--   no update replaces one of a higher attempt;
--   the update already stored, sent again, changes nothing (outcome unchanged);
--   a completed or failed session takes no running update.
-- Anything else raises session_update_refused (55K15) and writes nothing.
create or replace function keel.record_session_update(
    p_tenant_id uuid,
    p_session_id text,
    p_step_key text,
    p_status text,
    p_attempt integer default 1,
    p_result jsonb default null,
    p_error jsonb default null,
    p_actor text default null
)
returns table (
    outcome text,
    seq bigint,
    step_key text,
    status text,
    attempt integer,
    result jsonb,
    error jsonb
)
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
    v_now timestamptz := clock_timestamp();
    v_actor text := session_user;  -- the login, whatever role the function runs as
    v_session keel.sessions;
    v_latest keel.session_updates;
    v_seq bigint;
    v_refusal text;
    v_bytes bigint;
begin
    perform keel.require_tenant(p_tenant_id);
    if p_session_id is null or p_step_key is null or char_length(p_step_key) not between 1 and 200 then
        raise exception using
            errcode = '22K01',
            message = 'session id and a step key of 1 to 200 characters are required';
    end if;
    if p_status is null or p_status not in ('running', 'completed', 'failed') then
        raise exception using
            errcode = '22K01',
            message = format('unknown step status %s', coalesce(p_status, 'null')),
            hint = 'A step update is running, completed or failed.';
    end if;
    if p_attempt is null or p_attempt < 1 then
        raise exception using errcode = '22K01', message = 'attempt must be 1 or more';
    end if;
    if p_status = 'failed' and p_result is not null then
        raise exception using
            errcode = '22K01',
            message = 'a failed step update carries an error, not a result';
    end if;
    if p_status <> 'failed' and p_error is not null then
        raise exception using
            errcode = '22K01',
            message = format('a %s step update carries a result, not an error', p_status);
    end if;
    perform keel.check_actor(p_actor);
    perform keel.check_payload('session update result', p_result, 'max_session_update_bytes');
    perform keel.check_payload('session update error', p_error, 'max_session_update_bytes');

    -- Every writer of this session queues here: the step's latest update cannot change
    -- before this transaction ends.
    select s.* into v_session
    from keel.sessions as s
    where s.tenant_id = p_tenant_id and s.session_id = p_session_id
    for update;
    if not found then
        raise exception using
            errcode = '42K15',
            message = format('session %s not found', p_session_id),
            hint = 'Create it with keel.save_session first.';
    end if;

    if v_session.status in ('completed', 'failed') and p_status = 'running' then
        raise exception using
            errcode = '55K15',
            message = format(
                'session %s is %s, so a running update of step %s is refused',
                p_session_id, v_session.status, p_step_key
            ),
            detail = 'A non-terminal update never lands in a completed or failed session. Nothing was written.',
            hint = 'Start a new session for new work.';
    end if;

    select u.* into v_latest
    from keel.session_updates as u
    where u.tenant_id = p_tenant_id
        and u.session_id = p_session_id
        and u.step_key = p_step_key
    order by u.seq desc
    limit 1;

    if v_latest.seq is not null then
        if v_latest.status = p_status and v_latest.attempt = p_attempt
            and v_latest.result is not distinct from p_result
            and v_latest.error is not distinct from p_error then
            return query select
                'unchanged'::text, v_latest.seq, v_latest.step_key, v_latest.status,
                v_latest.attempt, v_latest.result, v_latest.error;
            return;
        end if;
        if p_attempt < v_latest.attempt then
            v_refusal := format('attempt %s is newer', v_latest.attempt);
        elsif v_latest.status in ('completed', 'failed') and p_status = 'running' then
            v_refusal := format('attempt %s already %s', v_latest.attempt, v_latest.status);
        elsif v_latest.status in ('completed', 'failed') and p_attempt = v_latest.attempt then
            v_refusal := format('attempt %s already %s', v_latest.attempt, v_latest.status);
        end if;
        if v_refusal is not null then
            raise exception using
                errcode = '55K15',
                message = format(
                    'step %s of session %s: %s, so a %s update of attempt %s is refused',
                    p_step_key, p_session_id, v_refusal, p_status, p_attempt
                ),
                detail = 'A non-terminal update never replaces a completed or failed one; a terminal one replaces it only with a higher attempt. Nothing was written.',
                hint = 'Load the session to see the step''s outcome; report a retry with the next attempt number.';
        end if;
    end if;

    v_bytes := coalesce(octet_length(p_result::text), 0) + coalesce(octet_length(p_error::text), 0);
    perform keel.check_session_quota(v_session, v_bytes);
    v_seq := v_session.last_update_seq + 1;
    update keel.sessions as s
    set
        last_update_seq = v_seq,
        update_bytes = s.update_bytes + v_bytes,
        updated_at = v_now
    where s.tenant_id = p_tenant_id and s.session_id = p_session_id;

    insert into keel.session_updates (
        tenant_id, session_id, seq, step_key, status, attempt, result, error, actor,
        claimed_actor, created_at
    )
    values (
        p_tenant_id, p_session_id, v_seq, p_step_key, p_status, p_attempt, p_result, p_error,
        v_actor, p_actor, v_now
    );

    return query select 'applied'::text, v_seq, p_step_key, p_status, p_attempt, p_result, p_error;
end;
$$;

comment on function keel.record_session_update(uuid, text, text, text, integer, jsonb, jsonb, text) is
'Appends one step update (running / completed / failed, with its attempt number and result or error) to a session, with the next per-session seq, under the session row''s lock. completed and failed are terminal for the step: a running update never replaces them, a terminal one only with a higher attempt, and no update replaces one of a higher attempt, and a completed or failed session takes no running update (session_update_refused, 55K15, nothing written). Sending the stored update again returns outcome unchanged; a new one, applied. session_not_found (42K15) without keel.save_session first. Result and error pass keel.check_payload (G9), and the session''s quota (keel.check_session_quota: settings.max_session_updates updates, settings.max_session_total_update_bytes bytes) is kept, else quota_exceeded (54K01) and nothing written; the login is recorded as actor, p_actor as claimed_actor.';
