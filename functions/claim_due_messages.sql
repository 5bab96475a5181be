-- Outbox delivery (G6): claim the named outbox messages of one tenant that are still
-- pending, due and the head of their key, in one call. The per-tenant step of the relay's
-- claim on Citus (the variant of keel.claim_outbox finds candidates with an unlocked scan,
-- then calls this once for each tenant's candidates, on the node that holds the tenant),
-- and of keel.claim_due_message. A message another relay holds locked, or that is no longer
-- claimable, is skipped, never waited on.
-- agentkeel:allow citus.require_tenant (keel_relay works across tenants and has no tenant context, as in keel.claim_outbox: it claims messages of every tenant by design)
-- agentkeel:allow citus.set_local_autocommit (on Citus this runs on the worker that holds the tenant, where the flag is set and read locally)
create or replace function keel.claim_due_messages(
    p_tenant_id uuid,
    p_message_ids uuid[],
    p_relay text,
    p_lease interval default '30 seconds',
    p_topic_prefix text default null
)
returns setof keel.outbox
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_now timestamptz := clock_timestamp();
    v_expires timestamptz;
    v_max_claims integer := keel.outbox_max_unreported_claims();
    v_secret bytea := keel.claim_secret();
    v_row record;
    v_ids uuid[] := '{}';
    v_dying uuid[] := '{}';
    v_dead uuid;
begin
    if p_tenant_id is null or p_message_ids is null or array_position(p_message_ids, null) is not null then
        raise exception using errcode = '22K01', message = 'tenant id and message ids are required';
    end if;
    v_expires := keel.check_lease_request(p_relay, p_lease, v_now);
    perform keel.check_claim_limit(greatest(cardinality(p_message_ids), 1));
    set local keel.outbox_delivery = on;
    for v_row in
        select o.message_id, o.claims
        from keel.outbox as o
        where o.tenant_id = p_tenant_id
            and o.message_id = any(p_message_ids)
            and o.state = 'pending'
            and o.available_at <= v_now
            and (p_topic_prefix is null or starts_with(o.topic, p_topic_prefix))
            and not o.held
            and (
                o.message_key is null
                or not exists (
                    select 1
                    from keel.outbox as e
                    where e.tenant_id = p_tenant_id
                        and e.message_key = o.message_key
                        and e.state = 'pending'
                        and (e.created_at, e.position, e.message_id)
                        < (o.created_at, o.position, o.message_id)
                )
            )
        for update of o skip locked
    loop
        if v_row.claims >= v_max_claims then
            v_dying := v_dying || v_row.message_id;
        else
            v_ids := v_ids || v_row.message_id;
        end if;
    end loop;
    foreach v_dead in array v_dying loop
        -- Dead instead of claimed; it makes its key's next message claimable.
        perform keel.claim_locked_message(p_tenant_id, v_dead, p_relay, v_now, v_expires);
    end loop;
    -- The claims, in one statement (the form of keel.claim_locked_message): one tenant, so
    -- on Citus it runs on the tenant's shard; the token is a function of the row's id
    -- (keel.claim_token_of), not a volatile call, which Citus would evaluate once.
    if cardinality(v_ids) > 0 then
        return query
        update keel.outbox as o
        set
            claim_token = keel.claim_token_of(v_secret, o.message_id),
            claimed_by = p_relay,
            claimed_at = v_now,
            available_at = v_expires,
            claims = o.claims + 1
        where o.tenant_id = p_tenant_id and o.message_id = any(v_ids)
        returning o.*;
    end if;
    set local keel.outbox_delivery = off;
end;
$$;

comment on function keel.claim_due_messages(uuid, uuid[], text, interval, text) is
'Claims those of the named outbox messages of p_tenant_id (at most settings.max_batch_items) that are still pending, due, of a topic starting with p_topic_prefix when given, not held, and the oldest pending message of their key, for p_relay until now + p_lease, as keel.claim_outbox does (a new claim_token each, claimed_by, available_at = expiry, claims + 1; dead instead after settings.outbox_max_unreported_claims claims with no ack or nack); returns them, in no set order. A message another transaction holds locked is skipped, never waited on. Needs no tenant context. The per-tenant step of the Citus variant of keel.claim_outbox, in one statement on the tenant''s node (G6).';
