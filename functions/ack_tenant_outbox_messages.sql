-- Outbox delivery (G6): ack delivered messages of one tenant in one statement. The step of
-- keel.ack_outbox_messages for each tenant of its batch; on Citus it runs on the node that
-- holds the tenant. One outcome row per message named, in order: an item whose claim was
-- lost (or whose message is gone) is refused with what keel.ack_outbox would raise for it
-- and changes nothing; the others are acked.
-- agentkeel:allow citus.require_tenant (keel_relay works across tenants and has no tenant context: each item's claim token is its credential for that message, as in keel.ack_outbox)
-- agentkeel:allow citus.set_local_autocommit (on Citus this runs on the worker that holds the tenant, where the flag is set and read locally)
-- agentkeel:requires functions/ack_outbox.sql
-- agentkeel:requires functions/count_pending_messages.sql
create or replace function keel.ack_tenant_outbox_messages(
    p_tenant_id uuid,
    p_message_ids uuid[],
    p_claim_tokens bigint[]
)
returns table (
    message_id uuid,
    refused_sqlstate text,
    refused_message text
)
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_now timestamptz := clock_timestamp();
    v_count integer := coalesce(cardinality(p_message_ids), 0);
    v_row record;
    v_acked boolean[] := array_fill(false, array[coalesce(cardinality(p_message_ids), 0)]);
    v_delivered integer := 0;
begin
    -- Item i is p_message_ids[i] and p_claim_tokens[i], from 1 (checked first:
    -- array_position refuses an array of more than one dimension).
    if coalesce(array_ndims(p_message_ids), 1) <> 1
        or coalesce(array_ndims(p_claim_tokens), 1) <> 1
        or coalesce(array_lower(p_message_ids, 1), 1) <> 1
        or coalesce(array_lower(p_claim_tokens, 1), 1) <> 1
        or p_tenant_id is null or p_message_ids is null or p_claim_tokens is null
        or cardinality(p_claim_tokens) <> v_count then
        raise exception using
            errcode = '22K01',
            message = 'a tenant id, and as many message ids as claim tokens, in arrays from 1, are required';
    end if;
    if array_position(p_message_ids, null) is not null then
        raise exception using errcode = '22K01', message = 'message ids must not be null';
    end if;
    if v_count > keel.max_batch_items() then
        raise exception using
            errcode = '22K01',
            message = format('a batch holds at most %s items, not %s', keel.max_batch_items(), v_count),
            hint = 'Split it; settings.max_batch_items sets the limit.';
    end if;
    set local keel.outbox_delivery = on;
    -- Every message whose token is its current claim (the fence of keel.assert_outbox_claim),
    -- in one statement on the tenant's rows.
    for v_row in
        update keel.outbox as o
        set
            state = 'delivered',
            delivered_at = v_now
        where o.tenant_id = p_tenant_id
            and o.message_id = any(p_message_ids)
            and o.state = 'pending'
            and o.claimed_by is not null
            and o.claim_token = p_claim_tokens[array_position(p_message_ids, o.message_id)]
        returning o.message_id, o.message_key
    loop
        v_acked[array_position(p_message_ids, v_row.message_id)] := true;
        v_delivered := v_delivered + 1;
        -- The next message of its key, if held, may be claimed now.
        perform keel.promote_outbox_head(p_tenant_id, v_row.message_key);
    end loop;
    if v_delivered > 0 then
        perform keel.count_pending_messages(p_tenant_id, -v_delivered);
    end if;
    for i in 1 .. v_count loop
        message_id := p_message_ids[i];
        refused_sqlstate := null;
        refused_message := null;
        if not v_acked[i] then
            begin
                -- Not acked above: acked alone, where a retried ack (delivered before with
                -- this token) changes nothing and a lost claim (55K08) or a message that is
                -- gone (42K08) is the item's refusal; any other error (a lock timeout, a
                -- serialization failure) fails the call, which changes nothing.
                perform keel.ack_outbox(p_tenant_id, p_message_ids[i], p_claim_tokens[i]);
            exception when sqlstate '55K08' or sqlstate '42K08' then
                get stacked diagnostics refused_sqlstate = returned_sqlstate, refused_message = message_text;
            end;
        end if;
        return next;
    end loop;
    set local keel.outbox_delivery = off;
end;
$$;

comment on function keel.ack_tenant_outbox_messages(uuid, uuid[], bigint[]) is
'Acks the named outbox messages of p_tenant_id (at most settings.max_batch_items; p_claim_tokens[i] is the claim token of p_message_ids[i]) in one statement: each whose token is its current claim is marked delivered and the next held message of its key promoted. One row per message named, in order: refused_sqlstate and refused_message null when the message is delivered with that token (now or by an earlier ack), else what keel.ack_outbox would raise: outbox_claim_lost (55K08) or message_not_found (42K08), and it changes nothing. Needs no tenant context: keel_relay works across tenants, and each token guards its message. The step of keel.ack_outbox_messages for each tenant of its batch; on Citus it runs on the tenant''s node (G6).';
