-- Quotas per tenant, in bytes and in sessions (G9). A checkpoint is up to 16 MiB and a task
-- may save 10,000, so counts per task bound a tenant's checkpoint bytes only by the number
-- of its tasks; an agent creates sessions without any bound. Bytes cannot be counted up to a
-- limit the way rows are (keel.check_quota), so a tenant's checkpoint bytes are kept in a
-- counter: one row per tenant, updated by keel.save_checkpoint under that row's lock (saves
-- of one tenant commit one after another, and none passes the limit in any isolation
-- level). What a purge removes is written as a credit (keel.tenant_usage_credits) and
-- folded into the counter by the next save, under its lock: the purge never waits on a save.
-- A tenant's row is made by its first save after this migration, from what it holds then
-- (counted in the tenant's own context: a migration, under forced row-level security,
-- would see no tenant's rows, and on Citus cannot insert from a distributed table).
create table keel.tenant_usage (
    tenant_id uuid not null,
    counter text not null,
    amount bigint not null,
    updated_at timestamptz not null default now(),
    constraint tenant_usage_pkey primary key (tenant_id, counter),
    constraint tenant_usage_tenant_fkey
    foreign key (tenant_id) references keel.tenants (tenant_id) on delete cascade,
    constraint tenant_usage_counter_check check (counter in ('checkpoint_bytes')),
    constraint tenant_usage_amount_check check (amount >= 0)
);

comment on table keel.tenant_usage is
'What a tenant holds of a resource counted in bytes, kept in step with its rows: checkpoint_bytes, the ciphertext bytes of its checkpoints (keel.add_tenant_usage adds each save and folds in the credits of purges; keel.recount_tenant_usage counts again). Checked against max_tenant_checkpoint_bytes. Written by the functions only; no application role reads or writes it.';

create table keel.tenant_usage_credits (
    tenant_id uuid not null,
    credit_id uuid not null default keel.uuid_v7(),
    counter text not null,
    amount bigint not null,
    created_at timestamptz not null default now(),
    constraint tenant_usage_credits_pkey primary key (tenant_id, credit_id),
    constraint tenant_usage_credits_tenant_fkey
    foreign key (tenant_id) references keel.tenants (tenant_id) on delete cascade,
    constraint tenant_usage_credits_counter_check check (counter in ('checkpoint_bytes')),
    constraint tenant_usage_credits_amount_check check (amount > 0)
);

comment on table keel.tenant_usage_credits is
'What a purge step removed of a counted resource (the bytes of the checkpoint payloads it deleted), written without touching keel.tenant_usage, so that a purge never waits on a tenant''s open save. The next keel.add_tenant_usage of the tenant folds the credits into its counter under the counter''s lock and removes them. Written by the functions only.';

-- Byte quotas are larger than counts: up to 1 PiB (counts stay at most 1,000,000,000,
-- checked by keel.set_tenant_quota). Not validated: each only widens the dropped check,
-- which every existing row passed.
-- agentkeel:allow squawk.ban-drop-constraint (each check is widened: every row still passes)
alter table keel.tenant_quotas drop constraint tenant_quotas_setting_check;

alter table keel.tenant_quotas add constraint tenant_quotas_setting_check check (
    setting in (
        'max_tenant_pending_messages', 'max_task_checkpoints', 'max_task_step_attempts',
        'max_tenant_checkpoint_bytes', 'max_tenant_sessions'
    )
) not valid;

alter table keel.tenant_quotas drop constraint tenant_quotas_value_check;

alter table keel.tenant_quotas add constraint tenant_quotas_value_check check (
    value between 0 and 1125899906842624
) not valid;

comment on column keel.tenant_quotas.setting is
'max_tenant_pending_messages, max_task_checkpoints, max_task_step_attempts, max_tenant_checkpoint_bytes or max_tenant_sessions.';

insert into keel.settings (setting, value, description)
values
(
    'max_tenant_checkpoint_bytes', '10737418240',
    'Most bytes of checkpoint ciphertext one tenant may hold (10 GiB); a save that would pass it is refused with quota_exceeded (54K01). Counted under concurrent saves without overshoot (keel.tenant_usage); what a purge removes is given back at the next save.'
),
(
    'max_tenant_sessions', '100000',
    'Most sessions one tenant may hold, active or closed (closed ones go with keel.purge); a save that would create one more is refused with quota_exceeded (54K01). Counted up to the limit from what the transaction sees: transactions of one tenant open at once may together pass it by the sessions they create.'
);
