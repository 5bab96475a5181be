-- Retention (G11): how long what is finished is kept before keel.purge removes it, for
-- every tenant in keel.settings and, where the owner sets one, a tenant's own period in
-- keel.tenant_retention. Values are PostgreSQL intervals; a long one ('100 years') keeps
-- rows for good. Idempotency keys have theirs already: each operation's expires_at.
create table keel.tenant_retention (
    tenant_id uuid not null,
    setting text not null,
    keep interval not null,
    updated_at timestamptz not null default now(),
    constraint tenant_retention_pkey primary key (tenant_id, setting),
    constraint tenant_retention_tenant_fkey
    foreign key (tenant_id) references keel.tenants (tenant_id) on delete cascade,
    constraint tenant_retention_setting_check check (
        setting in (
            'retain_finished_tasks', 'retain_closed_sessions', 'retain_old_checkpoints',
            'retain_delivered_messages', 'retain_dead_messages', 'retain_inbox'
        )
    ),
    constraint tenant_retention_keep_check check (keep >= interval '0')
);

comment on table keel.tenant_retention is
'A tenant''s own retention periods, in place of the keel.settings row of the same name for that tenant alone. Written by the owner only (keel.set_tenant_retention); no application role reads or writes it.';

insert into keel.settings (setting, value, description)
values
(
    'retain_finished_tasks', '90 days',
    'How long a task in a terminal state is kept after its last change, with its events, operations, steps, checkpoints and sessions; keel.purge removes it afterwards unless it still has a pending outbox message (G11).'
),
(
    'retain_closed_sessions', '30 days',
    'How long a completed or failed session is kept after its last change, with its step updates (G11).'
),
(
    'retain_old_checkpoints', '7 days',
    'How long a checkpoint that is no longer the one to resume from (invalidated, or older than an ok checkpoint of the same task and kind) is kept after it was saved; an expired one (past its ttl) goes at once (G11).'
),
(
    'retain_delivered_messages', '7 days',
    'How long a delivered outbox message is kept after its delivery (G11).'
),
(
    'retain_dead_messages', '30 days',
    'How long a dead outbox message is kept, for keel.replay_outbox, after it went dead (G11).'
),
(
    'retain_inbox', '30 days',
    'How long an inbox row (a message id a consumer applied, keel.inbox_accept) is kept: a redelivery after it is gone applies again, so keep it longer than any redelivery can come (G11).'
);
