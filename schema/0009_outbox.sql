-- The delivery layer: messages written in the same transaction as the change (G6).
create table keel.outbox (
    tenant_id uuid not null,
    message_id uuid not null default keel.uuid_v7(),
    task_id uuid,
    event_seq bigint,
    position integer not null default 1,
    topic text not null,
    message_key text,
    payload jsonb not null,
    headers jsonb not null default '{}',
    state text not null default 'pending',
    attempts integer not null default 0,
    available_at timestamptz not null default now(),
    created_at timestamptz not null default now(),
    delivered_at timestamptz,
    last_error text,
    constraint outbox_pkey primary key (tenant_id, message_id),
    constraint outbox_tenant_fkey
    foreign key (tenant_id) references keel.tenants (tenant_id) on delete cascade,
    constraint outbox_task_fkey
    foreign key (tenant_id, task_id)
    references keel.tasks (tenant_id, task_id) on delete cascade,
    constraint outbox_topic_check check (topic ~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,199}$'),
    constraint outbox_message_key_check check (char_length(message_key) between 1 and 500),
    constraint outbox_headers_check check (jsonb_typeof(headers) = 'object'),
    constraint outbox_state_check check (state in ('pending', 'delivered', 'dead')),
    constraint outbox_position_check check (position > 0),
    constraint outbox_attempts_check check (attempts >= 0),
    constraint outbox_last_error_check check (char_length(last_error) <= 4000)
)
with (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02
);

create index outbox_pending_idx on keel.outbox (available_at) where state = 'pending';

comment on table keel.outbox is
'Transactional outbox: a row exists if and only if the business change that wrote it committed (G6). The relay delivers pending rows at least once; consumers dedupe by message_id.';
comment on column keel.outbox.event_seq is
'The task event that wrote this message; with position it orders a task''s messages.';
comment on column keel.outbox.position is 'Order of the message among those written by one event.';
