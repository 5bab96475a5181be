-- Outbox delivery (G6): a relay acks a batch of delivered messages in one call: one call of
-- keel.ack_tenant_outbox_messages for each tenant of the batch (one UPDATE; on Citus on the
-- tenant's node), one outcome row per item, in order. An item whose claim was lost (or
-- whose message is gone) is refused with the SQLSTATE and message keel.ack_outbox would
-- raise for it, and changes nothing; the others are acked. SECURITY INVOKER: it reads no
-- table itself, so it is the same function on PostgreSQL and on Citus.
-- agentkeel:requires functions/check_batch.sql
-- agentkeel:requires functions/ack_tenant_outbox_messages.sql
create or replace function keel.ack_outbox_messages(p_items jsonb)
returns table (
    item integer,
    message_id uuid,
    refused_sqlstate text,
    refused_message text
)
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
    v_count integer;
    v_tenants uuid[];
    v_ids uuid[];
    v_tokens bigint[];
    v_states text[];
    v_messages text[];
    v_group record;
    v_outcome record;
begin
    v_count := keel.check_batch(p_items, array['tenant_id', 'message_id', 'claim_token']);
    begin
        select
            array_agg((i.value ->> 'tenant_id')::uuid order by i.n),
            array_agg((i.value ->> 'message_id')::uuid order by i.n),
            array_agg((i.value ->> 'claim_token')::bigint order by i.n)
        into v_tenants, v_ids, v_tokens
        from jsonb_array_elements(p_items) with ordinality as i (value, n);
    exception when invalid_text_representation or numeric_value_out_of_range then
        raise exception using
            errcode = '22K01',
            message = 'every batch item''s tenant_id and message_id must be uuids and its claim_token a bigint',
            detail = 'Nothing of the batch was run.';
    end;
    v_states := array_fill(null::text, array[v_count]);
    v_messages := array_fill(null::text, array[v_count]);
    for v_group in
        select c.tenant_id, array_agg(c.n order by c.n) as items,
            array_agg(c.message_id order by c.n) as ids, array_agg(c.token order by c.n) as tokens
        from unnest(v_tenants, v_ids, v_tokens) with ordinality as c (tenant_id, message_id, token, n)
        group by c.tenant_id
        -- In tenant order: each tenant's step updates a slot of its pending-message
        -- counter (keel.count_pending_messages), and two relays whose backends share a
        -- slot take those row locks in one order, never in a cycle.
        order by c.tenant_id
    loop
        -- Called in FROM, so on Citus it is delegated to the tenant's node.
        for v_outcome in
            select a.n, a.refused_sqlstate, a.refused_message
            from keel.ack_tenant_outbox_messages(v_group.tenant_id, v_group.ids, v_group.tokens)
                with ordinality as a (message_id, refused_sqlstate, refused_message, n)
        loop
            v_states[v_group.items[v_outcome.n]] := v_outcome.refused_sqlstate;
            v_messages[v_group.items[v_outcome.n]] := v_outcome.refused_message;
        end loop;
    end loop;
    for i in 1 .. v_count loop
        item := i;
        message_id := v_ids[i];
        refused_sqlstate := v_states[i];
        refused_message := v_messages[i];
        return next;
    end loop;
end;
$$;

comment on function keel.ack_outbox_messages(jsonb) is
'Acks a batch of outbox messages in one call (G6): p_items is a jsonb array (at most settings.max_batch_items) of objects with tenant_id, message_id and claim_token. Every item whose claim_token is its message''s current claim is marked delivered and the next held message of its key promoted, one statement per tenant of the batch (keel.ack_tenant_outbox_messages; on Citus on the tenant''s node); the result has one row per item, in order, with refused_sqlstate and refused_message null for an acked item (or one acked before with the same token), else what keel.ack_outbox would raise: outbox_claim_lost (55K08) or message_not_found (42K08), and that item changes nothing. A malformed batch raises invalid_argument (22K01) and writes nothing. Needs no tenant context: keel_relay works across tenants, and each item''s token guards its message. SECURITY INVOKER.';
