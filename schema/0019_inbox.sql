-- The inbox (G6): a consumer records each message id it has applied, in the same
-- transaction as the effect, so a redelivered message is applied once.
create table keel.inbox (
    tenant_id uuid not null,
    consumer text not null,
    message_id uuid not null,
    accepted_at timestamptz not null default now(),
    constraint inbox_pkey primary key (tenant_id, consumer, message_id),
    constraint inbox_tenant_fkey
    foreign key (tenant_id) references keel.tenants (tenant_id) on delete cascade,
    constraint inbox_consumer_check check (consumer ~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,199}$')
)
with (
    fillfactor = 90,
    autovacuum_vacuum_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.05
);

comment on table keel.inbox is
'Message ids a consumer has accepted (keel.inbox_accept), one row per (tenant, consumer, message): the consumer side of at-least-once delivery, so each effect applies once (G6). Retention is the purge''s job (G11).';
comment on column keel.inbox.consumer is
'The consuming service or handler: each consumer dedupes on its own.';
