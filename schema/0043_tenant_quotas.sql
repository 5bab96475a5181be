-- Quotas: what one tenant may have pending in the outbox, and what one task may save in
-- checkpoints and step attempts (keel.check_quota), with a default for every tenant in
-- keel.settings and, where the owner sets one, a tenant's own limit in keel.tenant_quotas.
-- Counted, not kept in counters: no row every writer of a tenant would update, and
-- nothing to drift when rows go. A count stops at the limit, so it costs at most the
-- limit's index entries, and only a tenant near its limit pays that much.
create table keel.tenant_quotas (
    tenant_id uuid not null,
    setting text not null,
    value bigint not null,
    updated_at timestamptz not null default now(),
    constraint tenant_quotas_pkey primary key (tenant_id, setting),
    constraint tenant_quotas_tenant_fkey
    foreign key (tenant_id) references keel.tenants (tenant_id) on delete cascade,
    constraint tenant_quotas_setting_check check (
        setting in ('max_tenant_pending_messages', 'max_task_checkpoints', 'max_task_step_attempts')
    ),
    constraint tenant_quotas_value_check check (value between 0 and 1000000000)
);

comment on table keel.tenant_quotas is
'A tenant''s own limits, in place of the keel.settings row of the same name for that tenant alone: a larger one for a tenant that needs it, a smaller one for one that must be held back. Written by the owner only (keel.set_tenant_quota); no application role reads or writes it.';
comment on column keel.tenant_quotas.setting is
'max_tenant_pending_messages, max_task_checkpoints or max_task_step_attempts.';

insert into keel.settings (setting, value, description)
values
(
    'max_tenant_pending_messages', '100000',
    'Most pending outbox messages (waiting, held, in backoff or claimed) one tenant may have; a transition whose messages would pass it is refused with quota_exceeded (54K01) and writes nothing. Concurrent transitions of one tenant may pass it by the messages they write together.'
),
(
    'max_task_checkpoints', '10000',
    'Most checkpoints one task may save (keel.save_checkpoint); past it a save is refused with quota_exceeded (54K01).'
),
(
    'max_task_step_attempts', '10000',
    'Most step attempts (every step, every attempt) one task may open (keel.begin_step); past it a step is refused with quota_exceeded (54K01).'
);
