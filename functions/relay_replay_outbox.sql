-- Outbox delivery (G6): the relay's operator replays a dead message of any tenant
-- (`agentkeel relay dead replay`), as keel.replay_outbox does for a tenant's session.
-- agentkeel:allow citus.require_tenant (keel_relay works across tenants and has no tenant context, as in keel.nack_outbox: the tenant and message ids name the one dead row it may replay)
-- agentkeel:allow citus.set_local_autocommit (in autocommit on Citus the delivery flag does not reach the shard: the lookup sees no row and raises message_not_found, never a silent success)
create or replace function keel.relay_replay_outbox(p_tenant_id uuid, p_message_id uuid)
returns keel.outbox
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_message keel.outbox;
begin
    -- No tenant context, as in keel.nack_outbox: keel_relay may already end any message
    -- (nack it dead, ack it); giving a dead one another delivery is within that reach.
    set local keel.outbox_delivery = on;
    v_message := keel.replay_dead_message(p_tenant_id, p_message_id);
    set local keel.outbox_delivery = off;
    return v_message;
end;
$$;

comment on function keel.relay_replay_outbox(uuid, uuid) is
'keel.replay_outbox for keel_relay, without a tenant context: the dead message back to pending, attempts and claims 0, the SAME message_id. Raises message_not_dead (55K09), message_not_found (42K08). For `agentkeel relay dead replay` (G6).';
