-- Outbox delivery (G6): the random secret of one claim call.
create or replace function keel.claim_secret()
returns bytea
language sql
volatile
-- No SET search_path: granted to no role, it runs in its caller's pinned one.
as $$
    -- 244 random bits from PostgreSQL's cryptographic source.
    select uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid());
$$;

comment on function keel.claim_secret() is
'A new random secret for one claim call (244 bits from gen_random_uuid), from which keel.claim_token_of derives each message''s claim token. Not granted to any role.';
