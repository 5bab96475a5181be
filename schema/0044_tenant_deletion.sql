-- Tenant deletion (G10): a tenant being deleted is marked, refused by every API call
-- (keel.require_tenant), and removed in bounded batches by keel.delete_tenant; what is
-- left of it afterwards is the record of its deletion and, if asked, its events'
-- tombstones: who made which transition, when, and no payload.
alter table keel.tenants add column deleting_since timestamptz;

comment on column keel.tenants.deleting_since is
'When keel.delete_tenant began to delete the tenant (null: a live tenant). From then on every API call for it is refused with tenant_deleted (55K17).';

-- Global, not a tenant table: the tenant it names no longer exists (so no row of
-- keel.tenants to reference and no tenant context to read it under). A reference
-- table on Citus: every node's keel.require_tenant reads it when a tenant has no row.
create table keel.tenant_deletions (
    deleted_tenant_id uuid not null,
    tenant_name text not null,
    events text not null,
    requested_at timestamptz not null,
    requested_by text not null,
    data_keys_destroyed integer not null,
    removed jsonb not null default '{}',
    finished_at timestamptz,
    constraint tenant_deletions_pkey primary key (deleted_tenant_id),
    constraint tenant_deletions_events_check check (events in ('tombstone', 'remove')),
    constraint tenant_deletions_removed_check check (jsonb_typeof(removed) = 'object'),
    constraint tenant_deletions_finished_check check (finished_at >= requested_at)
);

comment on table keel.tenant_deletions is
'One row per tenant deletion begun by keel.delete_tenant (G10): the policy it runs under, who began it and when, how many data keys were destroyed, the rows removed per table so far, and when it finished (the tenant''s row was removed). Its tenant id is never a tenant again. Owner and auditor only.';
comment on column keel.tenant_deletions.events is
'tombstone: each task event is kept in keel.task_event_tombstones without its payload, trace or claimed actor; remove: events are removed with everything else.';
comment on column keel.tenant_deletions.removed is
'Rows removed so far, by table (qualified name) to count.';

-- Global, like keel.tenant_deletions. Local on Citus: the coordinator keeps them (so no
-- foreign key to keel.tenant_deletions, a reference table there).
create table keel.task_event_tombstones (
    deleted_tenant_id uuid not null,
    task_id uuid not null,
    seq bigint not null,
    event_type text not null,
    from_state text,
    to_state text not null,
    state_version bigint not null,
    actor text not null,
    policy_version text,
    created_at timestamptz not null,
    constraint task_event_tombstones_pkey primary key (deleted_tenant_id, task_id, seq)
);

comment on table keel.task_event_tombstones is
'What is kept of a deleted tenant''s task events under the tombstone policy (G10): which transition (event type, states, version), who (the login) and when; never the payload, trace ids or the caller-supplied actor label. Append-only like the events; owner and auditor only.';
