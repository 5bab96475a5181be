-- Outbox delivery (G6): a relay gives an unused claim back (shutting down, or the sink is
-- unreachable: not the message's fault, so no attempt is spent).
-- agentkeel:allow citus.require_tenant (keel_relay works across tenants and has no tenant context: the claim token, checked by keel.assert_outbox_claim, is its credential for this one message)
-- agentkeel:allow citus.set_local_autocommit (in autocommit on Citus the delivery flag does not reach the shard: the lookup sees no row and raises message_not_found, never a silent success)
-- agentkeel:allow citus.definer_result (returns void by contract: the relay reads nothing back, and a failed fence raises)
create or replace function keel.release_outbox(
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
    -- No tenant context, as in keel.ack_outbox: the token and the tenant id guard it.
    set local keel.outbox_delivery = on;
    v_message := keel.lock_outbox_message(p_tenant_id, p_message_id);
    perform keel.assert_outbox_claim(v_message, p_claim_token);

    update keel.outbox as o
    set
        available_at = v_now,
        claimed_by = null,
        claims = greatest(o.claims - 1, 0)
    where o.tenant_id = p_tenant_id and o.message_id = p_message_id;
    set local keel.outbox_delivery = off;
end;
$$;

comment on function keel.release_outbox(uuid, uuid, bigint) is
'Gives a claim back unused (the relay is stopping, or the sink is unreachable): the message is available now, its attempts unchanged, and the claim is taken off its unreported claims. The claim token is not reset: the next claim gets a higher one. A stale token raises outbox_claim_lost (55K08) and changes nothing. Needs no tenant context (G6).';
