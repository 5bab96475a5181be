-- Tenancy: every tenant-owned row names its tenant, and is deleted with it.
create table keel.tenants (
    tenant_id uuid not null default keel.uuid_v7(),
    name text not null,
    created_at timestamptz not null default now(),
    constraint tenants_pkey primary key (tenant_id),
    constraint tenants_name_check check (char_length(name) between 1 and 200)
);

comment on table keel.tenants is
'One row per tenant. Every tenant-owned table has tenant_id in its primary key and a foreign key to this table.';
comment on column keel.tenants.name is
'A label for operators; not unique (a global unique key cannot be enforced once tables are distributed by tenant).';
