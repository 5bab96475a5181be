-- The states of each workflow version, and which of them are terminal (G3, G5): the one
-- definition of "terminal" that keel.define_workflow stores and keel.create_task,
-- keel.transition_task and keel.claim_lease read.
create table keel.workflow_states (
    workflow text not null,
    workflow_version integer not null,
    state text not null,
    terminal boolean not null,
    constraint workflow_states_pkey primary key (workflow, workflow_version, state),
    constraint workflow_states_workflow_fkey
    foreign key (workflow, workflow_version)
    references keel.workflows (workflow, workflow_version) on delete cascade,
    constraint workflow_states_state_check check (state ~ '^[a-z][a-z0-9_]{0,62}$')
);

comment on table keel.workflow_states is
'Every state of each workflow version (its initial state and the ends of its edges), written once by keel.define_workflow. A terminal state has no outgoing edge: a task in it is finished, never due and never leased.';
comment on column keel.workflow_states.terminal is
'True for a state the task ends in: entering it ends the lease and clears wake_at; a task created in it is not due.';

-- The versions defined before this table: a state with no outgoing edge is terminal, as
-- keel.transition_task decided until now.
insert into keel.workflow_states (workflow, workflow_version, state, terminal)
select
    s.workflow,
    s.workflow_version,
    s.state,
    not exists (
        select 1
        from keel.workflow_transitions as t
        where
            t.workflow = s.workflow
            and t.workflow_version = s.workflow_version
            and t.from_state = s.state
    ) as terminal
from (
    select
        w.workflow,
        w.workflow_version,
        w.initial_state as state
    from keel.workflows as w
    union
    select
        t.workflow,
        t.workflow_version,
        t.from_state
    from keel.workflow_transitions as t
    union
    select
        t.workflow,
        t.workflow_version,
        t.to_state
    from keel.workflow_transitions as t
) as s;
