-- Outbox delivery (G6): the claim token a claim grants a message.
create or replace function keel.claim_token_of(p_secret bytea, p_message_id uuid)
returns bigint
language sql
immutable
strict
-- No SET search_path: granted to no role, it runs in its caller's pinned one.
as $$
    -- 60 bits of sha256(secret, message id): the secret is random per claim call (from
    -- gen_random_uuid, a cryptographic source), so no relay can guess another's token, and
    -- each message of one call gets its own. A function of the row's column, not a volatile
    -- call: Citus evaluates a volatile function of an UPDATE once, for all its rows.
    select ('x' || left(encode(sha256(p_secret || uuid_send(p_message_id)), 'hex'), 15))::bit(60)::bigint;
$$;

comment on function keel.claim_token_of(bytea, uuid) is
'The claim token a claim grants the message: 60 bits of sha256(p_secret || message id), where p_secret is random per claim call (keel.claim_secret), so no relay can guess another''s token. Used by every function that grants a claim. Not granted to any role.';
