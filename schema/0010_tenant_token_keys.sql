-- Signing keys for tenant tokens: the context an untrusted role cannot forge (G1).
-- Readable by keel_owner only; a plain, per-node table (never distributed).
create table keel.tenant_token_keys (
    key_version integer not null,
    inner_key bytea not null,
    outer_key bytea not null,
    created_at timestamptz not null default now(),
    retired_at timestamptz,
    constraint tenant_token_keys_pkey primary key (key_version),
    constraint tenant_token_keys_key_version_check check (key_version > 0),
    constraint tenant_token_keys_inner_key_check check (octet_length(inner_key) = 64),
    constraint tenant_token_keys_outer_key_check check (octet_length(outer_key) = 64)
);

comment on table keel.tenant_token_keys is
'HMAC-SHA256 keys for tenant tokens, stored as the two padded keys (key xor ipad, key xor opad) so verification needs only the built-in sha256(). Rotate with keel.rotate_tenant_token_key(); a retired key verifies nothing.';
comment on column keel.tenant_token_keys.inner_key is 'The 64-byte key xor 0x36 (HMAC ipad).';
comment on column keel.tenant_token_keys.outer_key is 'The 64-byte key xor 0x5c (HMAC opad).';
