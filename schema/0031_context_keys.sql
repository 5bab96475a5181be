-- Worker context proofs (G1, Citus): the keys that sign an agent's verified tenant for the
-- worker nodes. On a Citus cluster the coordinator verifies an agent's tenant token (its
-- signing keys, keel.tenant_token_keys, never leave the coordinator) and hands the workers
-- a proof signed with one of these keys, bound to the agent's login; `agentkeel
-- distribute` creates the first key and copies this table to every worker. Readable by
-- keel_owner only; a plain, per-node table (never distributed). Unused on PostgreSQL alone.
create table keel.context_keys (
    key_version integer not null,
    inner_key bytea not null,
    outer_key bytea not null,
    created_at timestamptz not null default now(),
    retired_at timestamptz,
    constraint context_keys_pkey primary key (key_version),
    constraint context_keys_key_version_check check (key_version > 0),
    constraint context_keys_inner_key_check check (octet_length(inner_key) = 64),
    constraint context_keys_outer_key_check check (octet_length(outer_key) = 64)
);

comment on table keel.context_keys is
'HMAC-SHA256 keys for the worker context proofs of a Citus cluster (keel.context_proof), stored as the two padded keys like keel.tenant_token_keys. Rotate with keel.rotate_context_key(), then run agentkeel distribute to copy them to the workers; a retired key verifies nothing.';
comment on column keel.context_keys.inner_key is 'The 64-byte key xor 0x36 (HMAC ipad).';
comment on column keel.context_keys.outer_key is 'The 64-byte key xor 0x5c (HMAC opad).';
