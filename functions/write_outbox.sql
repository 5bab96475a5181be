-- Outbox delivery (G6): the messages of a transition, written in its transaction beside the
-- task's event (the event's seq, in their order), and a wake-up hint for relays.
create or replace function keel.write_outbox(p_task keel.tasks, p_messages jsonb, p_at timestamptz)
returns integer
language plpgsql
volatile
-- No SET search_path: granted to no role, it runs in its caller's pinned one.
as $$
declare
    v_held boolean;
    v_message jsonb;
    v_position integer := 0;
begin
    if jsonb_array_length(p_messages) > 0 then
        perform keel.check_quota(
            p_task.tenant_id, null, 'max_tenant_pending_messages', jsonb_array_length(p_messages)
        );
    end if;
    -- One single-row insert per message: an INSERT ... SELECT into a distributed table
    -- is shipped with COPY on Citus, which row-level security refuses.
    for v_message in select m.value from jsonb_array_elements(p_messages) as m (value) loop
        v_position := v_position + 1;
        -- A keyed message waits, held out of the claim index, behind a pending message of
        -- its key that this statement sees (this call's earlier ones too). No lock: a
        -- head retired meanwhile is caught by the relay's sweep (keel.promote_outbox_heads).
        -- Not in a SERIALIZABLE transaction, where the read would make two writers of one
        -- key abort each other (40001): there the message is left claimable, and the
        -- claim's per-key check orders it as before. Decided before the INSERT: Citus
        -- evaluates a function in VALUES on the coordinator.
        v_held := false;
        if v_message ->> 'key' is not null
            and current_setting('transaction_isolation') <> 'serializable' then
            v_held := exists (
                select 1
                from keel.outbox as e
                where e.tenant_id = p_task.tenant_id
                    and e.message_key = v_message ->> 'key'
                    and e.state = 'pending'
            );
        end if;
        insert into keel.outbox (
            tenant_id, task_id, event_seq, position, topic, message_key, payload, headers,
            available_at, created_at, held
        )
        values (
            p_task.tenant_id, p_task.task_id, p_task.last_event_seq, v_position,
            v_message ->> 'topic', v_message ->> 'key',
            coalesce(v_message -> 'payload', 'null'::jsonb),
            coalesce(v_message -> 'headers', '{}'::jsonb), p_at, p_at, v_held
        );
    end loop;
    if v_position > 0 then
        -- A wake-up hint for relays (sent at commit, if any); they poll too.
        perform pg_notify('keel_outbox', '');
    end if;
    return v_position;
end;
$$;

comment on function keel.write_outbox(keel.tasks, jsonb, timestamptz) is
'Writes the messages p_messages (checked by keel.check_outbox_messages and keel.check_payload) for the event the caller has just appended to task p_task (event_seq = p_task.last_event_seq, positions 1..n in array order), available at p_at, within the tenant''s max_tenant_pending_messages (keel.check_quota); a keyed message behind a pending one of its key is written held. NOTIFY keel_outbox when it wrote any. Returns how many it wrote. Shared by keel.transition_task; not granted to any role.';
