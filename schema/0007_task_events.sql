-- The events layer: append-only history, one row per transition (G3, G4).
create table keel.task_events (
    tenant_id uuid not null,
    task_id uuid not null,
    seq bigint not null,
    event_type text not null,
    from_state text,
    to_state text not null,
    state_version bigint not null,
    actor text not null,
    policy_version text,
    fencing_token bigint,
    payload jsonb not null default '{}',
    trace_id text,
    span_id text,
    created_at timestamptz not null default now(),
    constraint task_events_pkey primary key (tenant_id, task_id, seq),
    constraint task_events_tenant_fkey
    foreign key (tenant_id) references keel.tenants (tenant_id) on delete cascade,
    constraint task_events_task_fkey
    foreign key (tenant_id, task_id)
    references keel.tasks (tenant_id, task_id) on delete cascade,
    constraint task_events_seq_check check (seq > 0),
    constraint task_events_event_type_check check (event_type ~ '^[A-Za-z][A-Za-z0-9_.:-]{0,62}$'),
    constraint task_events_actor_check check (char_length(actor) between 1 and 200),
    constraint task_events_policy_version_check check (char_length(policy_version) <= 100),
    constraint task_events_payload_check check (jsonb_typeof(payload) = 'object'),
    constraint task_events_trace_id_check check (trace_id ~ '^[0-9a-f]{32}$'),
    constraint task_events_span_id_check check (span_id ~ '^[0-9a-f]{16}$')
);

comment on table keel.task_events is
'Append-only history of each task: one row per transition, written in the same transaction as the state change. seq runs 1, 2, 3 ... per task without gaps.';
comment on column keel.task_events.state_version is 'The task''s state_version after this event.';
comment on column keel.task_events.fencing_token is
'The lease token the writer presented, or null when the task was not leased.';
comment on column keel.task_events.policy_version is
'The version of the policy or prompt set that decided this transition, for audit.';
