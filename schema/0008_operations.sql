-- The steps layer: one logical operation per (tenant, idempotency key) (G2, G7).
create table keel.operations (
    tenant_id uuid not null,
    operation_id uuid not null default keel.uuid_v7(),
    task_id uuid,
    idempotency_key text not null,
    action text not null,
    input_hash text not null,
    state text not null default 'reserved',
    provider_reference text,
    result jsonb,
    error jsonb,
    attempts integer not null default 1,
    reserved_fencing_token bigint,
    trace_id text,
    span_id text,
    created_at timestamptz not null default now(),
    updated_at timestamptz not null default now(),
    completed_at timestamptz,
    expires_at timestamptz not null,
    constraint operations_pkey primary key (tenant_id, operation_id),
    constraint operations_idempotency_key_key unique (tenant_id, idempotency_key),
    constraint operations_tenant_fkey
    foreign key (tenant_id) references keel.tenants (tenant_id) on delete cascade,
    constraint operations_task_fkey
    foreign key (tenant_id, task_id)
    references keel.tasks (tenant_id, task_id) on delete cascade,
    constraint operations_idempotency_key_check
    check (char_length(idempotency_key) between 1 and 255),
    constraint operations_action_check check (char_length(action) between 1 and 200),
    constraint operations_input_hash_check check (char_length(input_hash) between 1 and 128),
    constraint operations_state_check
    check (state in ('reserved', 'succeeded', 'failed', 'retryable')),
    constraint operations_outcome_check check (
        case state
            when 'reserved' then result is null and error is null
            when 'succeeded' then result is not null and error is null
            else result is null and error is not null
        end
    ),
    constraint operations_provider_reference_check
    check (char_length(provider_reference) between 1 and 500),
    constraint operations_attempts_check check (attempts > 0),
    constraint operations_trace_id_check check (trace_id ~ '^[0-9a-f]{32}$'),
    constraint operations_span_id_check check (span_id ~ '^[0-9a-f]{16}$')
);

create index operations_expires_at_idx on keel.operations (expires_at);
create index operations_task_idx on keel.operations (tenant_id, task_id) where task_id is not null;

comment on table keel.operations is
'Idempotency ledger: one row per (tenant, idempotency_key). Replaying a key with the same input_hash returns the stored outcome; a different input_hash is refused (G2).';
comment on column keel.operations.input_hash is
'Caller-computed digest of the operation input (e.g. sha256 hex). Compared on every replay of the key.';
comment on column keel.operations.state is
'reserved: the caller may perform the effect; succeeded / failed: final, replayed as stored; retryable: the next reservation with the same input starts another attempt.';
comment on column keel.operations.reserved_fencing_token is
'The task lease token of the reservation. Lower than the task''s current token means the reserving worker lost its lease: reconcile with the provider.';
comment on column keel.operations.expires_at is
'Retention: the key is kept at least until then, and purged by retention afterwards (G11).';
