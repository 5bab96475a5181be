-- Checkpoint encryption (G9, G10): each tenant's data keys, stored only wrapped.
create table keel.tenant_data_keys (
    tenant_id uuid not null,
    key_version integer not null,
    wrapped_key bytea,
    wrapping_key_id text not null,
    created_at timestamptz not null default now(),
    destroyed_at timestamptz,
    constraint tenant_data_keys_pkey primary key (tenant_id, key_version),
    constraint tenant_data_keys_tenant_fkey
    foreign key (tenant_id) references keel.tenants (tenant_id) on delete cascade,
    constraint tenant_data_keys_key_version_check check (key_version > 0),
    constraint tenant_data_keys_wrapped_key_check
    check (octet_length(wrapped_key) between 40 and 1024),
    constraint tenant_data_keys_wrapping_key_id_check
    check (char_length(wrapping_key_id) between 1 and 200),
    constraint tenant_data_keys_destroyed_check
    check ((wrapped_key is null) = (destroyed_at is not null))
);

comment on table keel.tenant_data_keys is
'Per-tenant data keys for checkpoint payloads (G9, G10): random 256-bit keys made by the client, stored only wrapped (encrypted) by the key provider''s key, which the database never holds. Destroying a version (keel.destroy_tenant_data_keys) erases its wrapped key, so every payload encrypted with it becomes unreadable.';
comment on column keel.tenant_data_keys.wrapped_key is
'The data key encrypted by the key provider (AES-256-GCM, the tenant id as associated data): nonce, ciphertext and tag. Null once destroyed.';
comment on column keel.tenant_data_keys.wrapping_key_id is
'Which provider key wrapped it (a fingerprint, not the key), so a client holding another key says so instead of failing to decrypt.';
