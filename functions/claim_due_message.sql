-- Outbox delivery (G6): claim one named outbox message of one tenant if it is still
-- pending and due, else nothing. The per-tenant half of the relay's claim on Citus (the
-- variant of keel.claim_outbox finds candidates with an unlocked scan, then calls this for
-- each one, on the node that holds its tenant): a message another relay holds locked, or
-- that is no longer pending, due, or the head of its key, is skipped, never waited on.
-- agentkeel:allow citus.require_tenant (keel_relay works across tenants and has no tenant context, as in keel.claim_outbox: it claims messages of every tenant by design)
-- agentkeel:allow citus.set_local_autocommit (on Citus this runs on the worker that holds the tenant, where the flag is set and read locally)
create or replace function keel.claim_due_message(
    p_tenant_id uuid,
    p_message_id uuid,
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
    v_message keel.outbox;
begin
    if p_tenant_id is null or p_message_id is null then
        raise exception using errcode = '22K01', message = 'tenant id and message id are required';
    end if;
    v_expires := keel.check_lease_request(p_relay, p_lease, v_now);
    set local keel.outbox_delivery = on;
    select o.* into v_message
    from keel.outbox as o
    where o.tenant_id = p_tenant_id
        and o.message_id = p_message_id
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
    for update of o skip locked;
    if found then
        v_message := keel.claim_locked_message(p_tenant_id, p_message_id, p_relay, v_now, v_expires);
        if v_message.message_id is not null then
            return next v_message;
        end if;
    end if;
    set local keel.outbox_delivery = off;
end;
$$;

comment on function keel.claim_due_message(uuid, uuid, text, interval, text) is
'Claims the outbox message for p_relay until now + p_lease, as keel.claim_outbox does (new claim_token, claimed_by, available_at = expiry, claims + 1; dead instead after settings.outbox_max_unreported_claims claims with no ack or nack), if it is still pending, due, of a topic starting with p_topic_prefix when given, not held, and the oldest pending message of its key; returns no row otherwise or when another transaction holds it locked, and never waits. Needs no tenant context. The per-tenant step of the Citus variant of keel.claim_outbox (G6).';
