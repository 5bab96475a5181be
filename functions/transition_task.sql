-- Guarded transitions (G3): one legal edge, one event, optional outbox rows,
-- all in the caller's transaction, or nothing at all.
create or replace function keel.transition_task(
    p_tenant_id uuid,
    p_task_id uuid,
    p_expected_version bigint,
    p_to_state text,
    p_fencing_token bigint default null,
    p_event_type text default 'transition',
    p_payload jsonb default '{}',
    p_outbox jsonb default '[]',
    p_actor text default null,
    p_policy_version text default null,
    p_current_step text default null,
    p_release_lease boolean default false,
    p_wake_at timestamptz default null
)
returns keel.tasks
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_now timestamptz := clock_timestamp();
    v_task keel.tasks;
    v_from_state text;
    v_next_version bigint;
    v_seq bigint;
    v_terminal boolean;
    v_keep_lease boolean;
    v_wake_at timestamptz;
    v_message jsonb;
begin
    perform keel.require_tenant(p_tenant_id);
    if p_expected_version is null or p_to_state is null then
        raise exception using
            errcode = '22K01',
            message = 'expected version and target state are required';
    end if;
    if p_payload is null or jsonb_typeof(p_payload) <> 'object' then
        raise exception using errcode = '22K01', message = 'event payload must be a jsonb object';
    end if;
    -- No messages, the common case: nothing to check or write (nor a call each to do so).
    if p_outbox is distinct from '[]'::jsonb then
        perform keel.check_outbox_messages(p_outbox);
    end if;
    v_wake_at := keel.check_wake_at(p_wake_at, v_now);

    v_task := keel.lock_task(p_tenant_id, p_task_id);

    -- Fencing: a leased task is written only by its lease holder; an unleased
    -- task only by a caller that presents no token.
    if p_fencing_token is not null or v_task.lease_expires_at > v_now then
        perform keel.assert_lease(v_task, p_fencing_token, v_now);
    end if;

    -- The row is locked: this check cannot go stale before the update below.
    if v_task.state_version <> p_expected_version then
        raise exception using
            errcode = '55K01',
            message = format('stale state on task %s', p_task_id),
            detail = format(
                'Expected state_version %s, but the task is at %s (state %s).',
                p_expected_version, v_task.state_version, v_task.state
            ),
            hint = 'Another writer moved the task first. Re-read it and decide again.';
    end if;

    v_terminal := keel.check_edge(v_task, p_to_state);

    -- The payload checks walk the values: only once the cheap refusals (no such task, a
    -- lost lease, a stale version, no such edge) have had their say, so a batch of large
    -- payloads for tasks that do not exist costs a lookup each, not a walk.
    if p_payload <> '{}'::jsonb then
        perform keel.check_payload('event payload', p_payload, 'max_event_payload_bytes');
    end if;
    if p_outbox <> '[]'::jsonb then
        for v_message in select m.value from jsonb_array_elements(p_outbox) as m (value) loop
            perform keel.check_payload('outbox message', v_message, 'max_outbox_message_bytes');
        end loop;
    end if;

    v_from_state := v_task.state;
    v_next_version := v_task.state_version + 1;
    v_seq := v_task.last_event_seq + 1;
    v_keep_lease := p_fencing_token is not null and not v_terminal
        and not coalesce(p_release_lease, false);
    if v_terminal then
        v_wake_at := null;
    elsif v_keep_lease then
        v_wake_at := v_task.lease_expires_at;
    end if;

    update keel.tasks as t
    set
        state = p_to_state,
        state_version = v_next_version,
        last_event_seq = v_seq,
        current_step = coalesce(p_current_step, v_task.current_step),
        wake_at = v_wake_at,
        lease_owner = case when v_keep_lease then v_task.lease_owner end,
        lease_acquired_at = case when v_keep_lease then v_task.lease_acquired_at end,
        lease_expires_at = case when v_keep_lease then v_task.lease_expires_at end,
        updated_at = v_now
    where t.tenant_id = p_tenant_id and t.task_id = p_task_id
    returning t.* into v_task;

    perform keel.append_event(
        v_task, p_event_type, v_from_state, v_now, p_fencing_token, p_payload, p_actor,
        p_policy_version
    );
    if p_outbox <> '[]'::jsonb then
        perform keel.write_outbox(v_task, p_outbox, v_now);
    end if;

    return v_task;
end;
$$;

comment on function keel.transition_task(uuid, uuid, bigint, text, bigint, text, jsonb, jsonb, text, text, text, boolean, timestamptz) is
'Moves a task along one legal edge of its workflow version (G3). Succeeds only when p_expected_version is the current state_version (else stale_state, 55K01) and the edge is listed (else illegal_transition, 55K02); a leased task needs its current fencing token (else lease_lost, 55K03). Writes exactly one event with the next seq and the given outbox messages in the same transaction (and, when it wrote a message, NOTIFY keel_outbox as a wake-up hint for relays); on any error nothing is written. Entering a terminal state (keel.workflow_states) ends the lease and clears wake_at. The event records the login (session_user) as actor and p_actor as claimed_actor; payload and outbox messages pass keel.check_payload, after the lookup, lease, version and edge checks, and at most settings.max_transition_messages messages are written (else payload_rejected, 22K02) (G9); p_wake_at passes keel.check_wake_at.';
