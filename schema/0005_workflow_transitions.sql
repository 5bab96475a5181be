-- The legal state-machine edges, as data (G3).
create table keel.workflow_transitions (
    workflow text not null,
    workflow_version integer not null,
    from_state text not null,
    to_state text not null,
    constraint workflow_transitions_pkey
    primary key (workflow, workflow_version, from_state, to_state),
    constraint workflow_transitions_workflow_fkey
    foreign key (workflow, workflow_version)
    references keel.workflows (workflow, workflow_version) on delete cascade,
    constraint workflow_transitions_from_state_check
    check (from_state ~ '^[a-z][a-z0-9_]{0,62}$'),
    constraint workflow_transitions_to_state_check
    check (to_state ~ '^[a-z][a-z0-9_]{0,62}$')
);

comment on table keel.workflow_transitions is
'Legal edges of each workflow version. keel.transition_task refuses any edge not listed here (G3). A state with no outgoing edge is terminal.';
