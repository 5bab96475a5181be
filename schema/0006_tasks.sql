-- The instance layer: one row per workflow run, with its lease (G3, G5).
create table keel.tasks (
    tenant_id uuid not null,
    task_id uuid not null default keel.uuid_v7(),
    workflow text not null,
    workflow_version integer not null,
    state text not null,
    state_version bigint not null default 1,
    last_event_seq bigint not null default 0,
    current_step text,
    wake_at timestamptz,
    lease_owner text,
    fencing_token bigint not null default 0,
    lease_acquired_at timestamptz,
    lease_expires_at timestamptz,
    trace_id text,
    span_id text,
    metadata jsonb not null default '{}',
    created_at timestamptz not null default now(),
    updated_at timestamptz not null default now(),
    constraint tasks_pkey primary key (tenant_id, task_id),
    constraint tasks_tenant_fkey
    foreign key (tenant_id) references keel.tenants (tenant_id) on delete cascade,
    constraint tasks_workflow_fkey
    foreign key (workflow, workflow_version)
    references keel.workflows (workflow, workflow_version),
    constraint tasks_state_check check (state ~ '^[a-z][a-z0-9_]{0,62}$'),
    constraint tasks_state_version_check check (state_version > 0),
    constraint tasks_last_event_seq_check check (last_event_seq >= 0),
    constraint tasks_current_step_check check (char_length(current_step) between 1 and 200),
    constraint tasks_fencing_token_check check (fencing_token >= 0),
    constraint tasks_lease_owner_check check (char_length(lease_owner) between 1 and 200),
    constraint tasks_lease_complete_check check (
        (lease_owner is null) = (lease_expires_at is null)
        and (lease_owner is null) = (lease_acquired_at is null)
    ),
    constraint tasks_trace_id_check
    check (trace_id ~ '^[0-9a-f]{32}$' and trace_id <> '00000000000000000000000000000000'),
    constraint tasks_span_id_check
    check (span_id ~ '^[0-9a-f]{16}$' and span_id <> '0000000000000000'),
    constraint tasks_metadata_check check (jsonb_typeof(metadata) = 'object')
)
with (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);

-- Only claimable rows sit in the claim index: terminal tasks have wake_at null.
create index tasks_due_idx on keel.tasks (wake_at) where wake_at is not null;

comment on table keel.tasks is
'One row per workflow instance: its state, its version for optimistic concurrency (G3), and its lease with a fencing token (G5).';
comment on column keel.tasks.state_version is
'Incremented by every transition; keel.transition_task succeeds only with the current value.';
comment on column keel.tasks.last_event_seq is
'The seq of the newest row in keel.task_events for this task: the per-task counter that orders events.';
comment on column keel.tasks.wake_at is
'When the task is next due for a worker. While leased it equals lease_expires_at, so an expired lease makes the task due again. Null once the task is terminal.';
comment on column keel.tasks.fencing_token is
'Incremented on every lease acquisition. Every fenced write must present the current token (G5).';
comment on column keel.tasks.trace_id is 'W3C trace-context trace id (32 lower-case hex digits).';
comment on column keel.tasks.span_id is 'W3C trace-context parent span id (16 lower-case hex digits).';
