-- Retention (G11): how long tenant p_tenant_id keeps what p_setting names: its own period
-- (keel.tenant_retention), else the one for every tenant (keel.settings), else the
-- shipped default.
create or replace function keel.retention_period(p_tenant_id uuid, p_setting text)
returns interval
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_keep interval;
begin
    select r.keep into v_keep
    from keel.tenant_retention as r
    where r.tenant_id = p_tenant_id and r.setting = p_setting;
    if v_keep is null then
        select s.value::interval into v_keep from keel.settings as s where s.setting = p_setting;
    end if;
    -- Within 0 and 100 years whatever a row says: a period past the calendar would make
    -- now() - period overflow, and the purge fail.
    return least(greatest(coalesce(
        v_keep,
        case p_setting
            when 'retain_finished_tasks' then interval '90 days'
            when 'retain_closed_sessions' then interval '30 days'
            when 'retain_old_checkpoints' then interval '7 days'
            when 'retain_delivered_messages' then interval '7 days'
            when 'retain_dead_messages' then interval '30 days'
            when 'retain_inbox' then interval '30 days'
        end
    ), interval '0'), interval '100 years');
end;
$$;

comment on function keel.retention_period(uuid, text) is
'The retention period p_setting (retain_finished_tasks, retain_closed_sessions, retain_old_checkpoints, retain_delivered_messages, retain_dead_messages, retain_inbox) of tenant p_tenant_id: keel.tenant_retention, else keel.settings, else the shipped default, held within 0 and 100 years. Internal to keel.purge (G11).';
