-- Workflow versions: global (reference) data, never tenant-owned.
create table keel.workflows (
    workflow text not null,
    workflow_version integer not null,
    initial_state text not null,
    description text,
    created_at timestamptz not null default now(),
    constraint workflows_pkey primary key (workflow, workflow_version),
    constraint workflows_workflow_check check (workflow ~ '^[a-z][a-z0-9_.-]{0,62}$'),
    constraint workflows_version_check check (workflow_version > 0),
    constraint workflows_initial_state_check check (initial_state ~ '^[a-z][a-z0-9_]{0,62}$'),
    constraint workflows_description_check check (char_length(description) <= 2000)
);

comment on table keel.workflows is
'Immutable workflow versions: a task is pinned to the version it was created with. Change a workflow by defining a new version.';
comment on column keel.workflows.initial_state is
'The state a new task of this workflow version starts in.';
