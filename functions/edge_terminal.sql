-- Guarded transitions (G3): the one lookup of an edge of a workflow version, and whether
-- its target ends the task (keel.workflow_states). keel.check_edge refuses a missing edge;
-- keel.transition_tasks checks the edges of a batch's items with it, refusing none itself.
create or replace function keel.edge_terminal(
    p_workflow text,
    p_workflow_version integer,
    p_from_state text,
    p_to_state text
)
returns boolean
language plpgsql
stable
-- No SET search_path: granted to no role, it runs in its caller's pinned one.
as $$
declare
    v_terminal boolean;
begin
    select s.terminal into v_terminal
    from keel.workflow_transitions as w
    inner join keel.workflow_states as s
        on s.workflow = w.workflow
        and s.workflow_version = w.workflow_version
        and s.state = w.to_state
    where w.workflow = p_workflow
        and w.workflow_version = p_workflow_version
        and w.from_state = p_from_state
        and w.to_state = p_to_state;
    return v_terminal;
end;
$$;

comment on function keel.edge_terminal(text, integer, text, text) is
'Whether p_to_state is terminal, when p_from_state -> p_to_state is an edge of workflow p_workflow version p_workflow_version; null when it is no edge. Shared by keel.check_edge and keel.transition_tasks; not granted to any role.';
