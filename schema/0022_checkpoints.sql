-- Recovery points (G8): where a task resumes after a crash. The payload is encrypted by
-- the client and kept apart, in keel.checkpoint_payloads.
create table keel.checkpoints (
    tenant_id uuid not null,
    checkpoint_id uuid not null,
    task_id uuid not null,
    seq integer not null,
    kind text not null,
    step_key text,
    schema_version integer not null,
    payload_hash text not null,
    status text not null default 'ok',
    fencing_token bigint not null,
    created_at timestamptz not null default now(),
    expires_at timestamptz,
    constraint checkpoints_pkey primary key (tenant_id, checkpoint_id),
    constraint checkpoints_task_seq_key unique (tenant_id, task_id, seq),
    constraint checkpoints_tenant_fkey
    foreign key (tenant_id) references keel.tenants (tenant_id) on delete cascade,
    constraint checkpoints_task_fkey
    foreign key (tenant_id, task_id)
    references keel.tasks (tenant_id, task_id) on delete cascade,
    constraint checkpoints_seq_check check (seq > 0),
    constraint checkpoints_kind_check check (kind ~ '^[A-Z][A-Z0-9_]{0,62}$'),
    constraint checkpoints_step_key_check check (char_length(step_key) between 1 and 200),
    constraint checkpoints_schema_version_check check (schema_version > 0),
    constraint checkpoints_payload_hash_check check (payload_hash ~ '^[0-9a-f]{64}$'),
    constraint checkpoints_status_check check (status in ('ok', 'invalid'))
);

comment on table keel.checkpoints is
'Typed recovery points of a task (G8), numbered per task by seq. keel.latest_checkpoint returns the newest with status ok that has not expired. The payload is ciphertext in keel.checkpoint_payloads.';
comment on column keel.checkpoints.kind is
'INPUT, TOOL_RESULT, SYNTHESIS, DELIVERY, or a workflow-defined kind in the same form (upper-case letters, digits, underscores).';
comment on column keel.checkpoints.schema_version is
'The version of the payload''s own schema, so a resuming worker knows how to read it.';
comment on column keel.checkpoints.payload_hash is
'sha256 (hex) of the stored ciphertext, checked by keel.save_checkpoint. Not of the plaintext: a plaintext digest would let anyone who reads the table confirm a guessed payload.';
comment on column keel.checkpoints.status is
'ok: usable; invalid: marked unusable by keel.invalidate_checkpoint and skipped when resuming.';
comment on column keel.checkpoints.fencing_token is 'The lease token of the worker that saved it.';
comment on column keel.checkpoints.expires_at is
'After this the checkpoint is no longer offered for resuming; null: kept with the task.';
