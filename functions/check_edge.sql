-- Guarded transitions (G3): is state -> p_to_state an edge of the task's workflow version?
-- The edge is looked up by keel.edge_terminal, which also says whether it ends the task
-- (its target is terminal, keel.workflow_states).
-- agentkeel:requires functions/edge_terminal.sql
create or replace function keel.check_edge(p_task keel.tasks, p_to_state text)
returns boolean
language plpgsql
stable
-- No SET search_path: granted to no role, it runs in its caller's pinned one.
as $$
declare
    v_terminal boolean;
begin
    v_terminal := keel.edge_terminal(
        p_task.workflow, p_task.workflow_version, p_task.state, p_to_state
    );
    if v_terminal is null then
        raise exception using
            errcode = '55K02',
            message = format('illegal transition %s -> %s', p_task.state, p_to_state),
            detail = format(
                'Workflow %s version %s has no such edge.', p_task.workflow, p_task.workflow_version
            ),
            hint = 'See keel.workflow_transitions for the legal edges.';
    end if;
    return v_terminal;
end;
$$;

comment on function keel.check_edge(keel.tasks, text) is
'Returns whether p_to_state is terminal when p_task.state -> p_to_state is an edge of the task''s workflow version; raises illegal_transition (55K02) when it is not. Shared by keel.transition_task; not granted to any role.';
