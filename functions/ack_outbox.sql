-- Outbox delivery (G6): the sink confirmed a message; it is delivered.
-- agentkeel:requires functions/count_pending_messages.sql
-- agentkeel:allow citus.require_tenant (keel_relay works across tenants and has no tenant context: the claim token, checked by keel.assert_outbox_claim, is its credential for this one message)
-- agentkeel:allow citus.set_local_autocommit (in autocommit on Citus the delivery flag does not reach the shard: the lookup sees no row and raises message_not_found, never a silent success)
-- agentkeel:allow citus.definer_result (returns void by contract: the relay reads nothing back, and a failed fence raises)
create or replace function keel.ack_outbox(
    p_tenant_id uuid,
    p_message_id uuid,
    p_claim_token bigint
)
returns void
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_now timestamptz := clock_timestamp();
    v_message keel.outbox;
begin
    -- No tenant context: keel_relay delivers every tenant's messages by design (it reads
    -- them all through keel.claim_outbox), so naming (tenant, message, current token)
    -- lets it do nothing it could not do by claiming. The token fences relays from each
    -- other; the explicit tenant id routes the statement (one tenant per call).
    set local keel.outbox_delivery = on;
    v_message := keel.lock_outbox_message(p_tenant_id, p_message_id);
    if v_message.state = 'delivered' and v_message.claim_token = p_claim_token then
        set local keel.outbox_delivery = off;
        return;  -- acked before with this token: a retried ack changes nothing
    end if;
    perform keel.assert_outbox_claim(v_message, p_claim_token);

    update keel.outbox as o
    set
        state = 'delivered',
        delivered_at = v_now
    where o.tenant_id = p_tenant_id and o.message_id = p_message_id;
    perform keel.count_pending_messages(p_tenant_id, -1);
    -- The next message of its key, if held, may be claimed now.
    perform keel.promote_outbox_head(p_tenant_id, v_message.message_key);
    set local keel.outbox_delivery = off;
end;
$$;

comment on function keel.ack_outbox(uuid, uuid, bigint) is
'Marks the message delivered. p_claim_token must be the current claim token (else outbox_claim_lost, 55K08, and nothing changes); an expired claim nobody has taken over may still be acked. Acking again with the same token is a no-op; an unknown message raises message_not_found (42K08). Needs no tenant context: keel_relay works across tenants, and the token plus the explicit tenant id guard the call (G6).';
