-- Recovery points (G8, G9): checkpoint payloads, as ciphertext only.
create table keel.checkpoint_payloads (
    tenant_id uuid not null,
    checkpoint_id uuid not null,
    key_version integer not null,
    nonce bytea not null,
    ciphertext bytea not null,
    constraint checkpoint_payloads_pkey primary key (tenant_id, checkpoint_id),
    constraint checkpoint_payloads_tenant_fkey
    foreign key (tenant_id) references keel.tenants (tenant_id) on delete cascade,
    constraint checkpoint_payloads_checkpoint_fkey
    foreign key (tenant_id, checkpoint_id)
    references keel.checkpoints (tenant_id, checkpoint_id) on delete cascade,
    constraint checkpoint_payloads_key_fkey
    foreign key (tenant_id, key_version)
    references keel.tenant_data_keys (tenant_id, key_version),
    constraint checkpoint_payloads_nonce_check check (octet_length(nonce) = 12),
    constraint checkpoint_payloads_ciphertext_check check (octet_length(ciphertext) >= 16)
);

alter table keel.checkpoint_payloads alter column ciphertext set storage external;

comment on table keel.checkpoint_payloads is
'The payload of each checkpoint, encrypted by the client with AES-256-GCM under the tenant''s data key version key_version; the tenant, task and checkpoint ids are its associated data, so a ciphertext copied to another row fails to decrypt. The database never sees the plaintext or the data key (G9, G10).';
comment on column keel.checkpoint_payloads.nonce is 'The 96-bit AES-GCM nonce, random per payload.';
comment on column keel.checkpoint_payloads.ciphertext is
'AES-GCM ciphertext followed by its 16-byte tag. Stored uncompressed (it does not compress).';
