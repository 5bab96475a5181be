-- Outbox delivery (G6): a delivery attempt failed; back off, or give up.
-- agentkeel:requires functions/count_pending_messages.sql
-- agentkeel:allow citus.require_tenant (keel_relay works across tenants and has no tenant context: the claim token, checked by keel.assert_outbox_claim, is its credential for this one message)
-- agentkeel:allow citus.set_local_autocommit (in autocommit on Citus the delivery flag does not reach the shard: the lookup sees no row and raises message_not_found, never a silent success)
create or replace function keel.nack_outbox(
    p_tenant_id uuid,
    p_message_id uuid,
    p_claim_token bigint,
    p_error text,
    p_dead boolean default false
)
returns keel.outbox
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_now timestamptz := clock_timestamp();
    v_message keel.outbox;
    v_error text := left(coalesce(p_error, 'no error given'), 4000);
    v_available timestamptz;
begin
    -- No tenant context, as in keel.ack_outbox: the token and the tenant id guard it.
    set local keel.outbox_delivery = on;
    v_message := keel.lock_outbox_message(p_tenant_id, p_message_id);
    perform keel.assert_outbox_claim(v_message, p_claim_token);

    -- This failure is the attempt; the claim it ends is reported (claims back to 0).
    if coalesce(p_dead, false)
        or v_message.attempts + 1 >= keel.outbox_max_attempts(v_message.topic) then
        update keel.outbox as o
        set
            state = 'dead',
            dead_at = v_now,
            claimed_by = null,
            attempts = o.attempts + 1,
            claims = 0,
            last_error = v_error
        where o.tenant_id = p_tenant_id and o.message_id = p_message_id
        returning o.* into v_message;
        perform keel.count_pending_messages(p_tenant_id, -1);
        perform keel.promote_outbox_head(p_tenant_id, v_message.message_key);
    else
        v_available := v_now + keel.outbox_backoff(v_message.attempts + 1);
        update keel.outbox as o
        set
            available_at = v_available,
            claimed_by = null,
            attempts = o.attempts + 1,
            claims = 0,
            last_error = v_error
        where o.tenant_id = p_tenant_id and o.message_id = p_message_id
        returning o.* into v_message;
    end if;
    set local keel.outbox_delivery = off;
    return v_message;
end;
$$;

comment on function keel.nack_outbox(uuid, uuid, bigint, text, boolean) is
'Records a failed delivery: attempts + 1, last_error = p_error (cut to 4000 characters; do not put secrets in it), claims back to 0, and the claim ends. The message is dead (dead_at) when p_dead (a permanent refusal) or when its attempts reach the topic''s maximum (keel.outbox_topics, else settings.outbox_max_attempts); otherwise it is available again after keel.outbox_backoff(attempts) = random() * least(cap, base * 2^(attempts - 1)). A stale token raises outbox_claim_lost (55K08) and changes nothing. Needs no tenant context (G6).';
