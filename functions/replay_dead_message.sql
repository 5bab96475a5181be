-- Outbox delivery (G6): the one place a dead message goes back to pending, under the same
-- id. keel.replay_outbox (a tenant's trusted session) and keel.relay_replay_outbox (the
-- relay, across tenants) call it once they have checked their caller.
create or replace function keel.replay_dead_message(p_tenant_id uuid, p_message_id uuid)
returns keel.outbox
language plpgsql
volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    v_now timestamptz := clock_timestamp();
    v_message keel.outbox;
begin
    v_message := keel.lock_outbox_message(p_tenant_id, p_message_id);
    if v_message.state <> 'dead' then
        raise exception using
            errcode = '55K09',
            message = format('outbox message %s is %s, not dead', p_message_id, v_message.state),
            hint = 'Only a dead message can be replayed; a pending one is still being delivered.';
    end if;
    -- Pending again: within the tenant's quota of pending messages, as a new one would be.
    perform keel.check_quota(p_tenant_id, null, 'max_tenant_pending_messages', 1);

    update keel.outbox as o
    set
        state = 'pending',
        attempts = 0,
        claims = 0,
        dead_at = null,
        claimed_by = null,
        available_at = v_now,
        held = false  -- older than the rest of its key: the claim's per-key check orders it
    where o.tenant_id = p_tenant_id and o.message_id = p_message_id
    returning o.* into v_message;
    perform pg_notify('keel_outbox', '');  -- a wake-up hint for relays; they poll too
    return v_message;
end;
$$;

comment on function keel.replay_dead_message(uuid, uuid) is
'Puts the dead message back to pending, available now, with attempts 0, claims 0 and the SAME message_id; raises message_not_dead (55K09) for a pending or delivered message, quota_exceeded (54K01) when the tenant already has its max_tenant_pending_messages, message_not_found (42K08) for an unknown one. The caller has checked who may replay it. Not granted to any role.';
