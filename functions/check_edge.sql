-- Guarded transitions (G3): is state -> p_to_state an edge of the task's workflow version?
-- The one place a transition's edge is looked up; it also says whether the edge ends the
-- task (its target is terminal, keel.workflow_states).
create or replace function keel.check_edge(p_task keel.tasks, p_to_state text)
returns boolean
language plpgsql
stable
set search_path = pg_catalog, pg_temp
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
    where w.workflow = p_task.workflow
        and w.workflow_version = p_task.workflow_version
        and w.from_state = p_task.state
        and w.to_state = p_to_state;
    if not found then
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
