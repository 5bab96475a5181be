-- Outbox delivery (G6): claim one named outbox message of one tenant if it is still
-- pending and due, else nothing: keel.claim_due_messages for one message (the relay claims
-- a suspect message alone with it). A message another relay holds locked, or that is no
-- longer pending, due, or the head of its key, is skipped, never waited on.
-- agentkeel:requires functions/claim_due_messages.sql
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
begin
    -- keel.claim_due_messages refuses a null tenant or message id (22K01).
    return query
    select c.*
    from keel.claim_due_messages(p_tenant_id, array[p_message_id], p_relay, p_lease, p_topic_prefix) as c;
end;
$$;

comment on function keel.claim_due_message(uuid, uuid, text, interval, text) is
'Claims the outbox message for p_relay until now + p_lease, as keel.claim_outbox does (new claim_token, claimed_by, available_at = expiry, claims + 1; dead instead after settings.outbox_max_unreported_claims claims with no ack or nack), if it is still pending, due, of a topic starting with p_topic_prefix when given, not held, and the oldest pending message of its key; returns no row otherwise or when another transaction holds it locked, and never waits. Needs no tenant context. keel.claim_due_messages for one message (G6).';
