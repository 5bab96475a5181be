-- Tenant deletion (G10): one pass over the tenant tables, children first
-- (keel.tenant_deletion_order), removing at most p_budget rows of the tenant in all. Task
-- events go through a purge (the only way they are ever deleted, G4), and under the
-- tombstone policy each one is first kept, without its payload, in
-- keel.task_event_tombstones. Rows are named by primary key, so a delete never cascades
-- past its batch: the tables that refer to a row were emptied before it.
-- agentkeel:requires functions/tenant_deletion_order.sql
create or replace function keel.delete_tenant_rows(
    p_tenant_id uuid,
    p_events text,
    p_budget integer
)
returns table (relation text, removed bigint)
language plpgsql
volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    v_left integer := p_budget;
    v_table record;
    v_count bigint;
    v_tasks uuid[];
    v_seqs bigint[];
begin
    for v_table in select o.relation, o.key_columns from keel.tenant_deletion_order() as o loop
        exit when v_left <= 0;
        if v_table.relation = 'keel.task_events'::regclass then
            select array_agg(e.task_id), array_agg(e.seq) into v_tasks, v_seqs
            from (
                select x.task_id, x.seq from keel.task_events as x
                where x.tenant_id = p_tenant_id
                limit v_left
            ) as e;
            continue when v_tasks is null;
            if p_events = 'tombstone' then
                insert into keel.task_event_tombstones (
                    deleted_tenant_id, task_id, seq, event_type, from_state, to_state,
                    state_version, actor, policy_version, created_at
                )
                select
                    e.tenant_id, e.task_id, e.seq, e.event_type, e.from_state, e.to_state,
                    e.state_version, e.actor, e.policy_version, e.created_at
                from keel.task_events as e
                where
                    e.tenant_id = p_tenant_id
                    and (e.task_id, e.seq) in (select k.t, k.s from unnest(v_tasks, v_seqs) as k (t, s))
                on conflict on constraint task_event_tombstones_pkey do nothing;
            end if;
            -- A statement, not set_config(): on Citus only SET LOCAL reaches the workers.
            set local keel.purge = on;
            delete from keel.task_events as e
            where
                e.tenant_id = p_tenant_id
                and (e.task_id, e.seq) in (select k.t, k.s from unnest(v_tasks, v_seqs) as k (t, s));
            get diagnostics v_count = row_count;
            set local keel.purge = off;
        else
            -- The candidates in a MATERIALIZED CTE: a LIMIT in an IN (subquery) may be
            -- run again by the plan and take more rows than the budget.
            execute format(
                'with c as materialized (select %2$s from %1$s as s where s.tenant_id = $1 limit $2)'
                ' delete from %1$s as t where t.tenant_id = $1 and (%2$s) in (select %2$s from c)',
                v_table.relation, v_table.key_columns
            ) using p_tenant_id, v_left;
            get diagnostics v_count = row_count;
        end if;
        if v_count > 0 then
            v_left := v_left - v_count;
            relation := v_table.relation::text;
            removed := v_count;
            return next;
        end if;
    end loop;
end;
$$;

comment on function keel.delete_tenant_rows(uuid, text, integer) is
'Internal to keel.delete_tenant (G10): removes at most p_budget rows of the tenant, table by table in keel.tenant_deletion_order, keeping task events as tombstones when p_events is tombstone; returns the rows removed per table (tables it removed nothing from are not listed). Runs in the caller''s transaction and tenant context.';
