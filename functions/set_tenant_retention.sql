-- Retention (G11): the owner sets (or, with null, removes) one tenant's own retention period.
create or replace function keel.set_tenant_retention(
    p_tenant_id uuid,
    p_setting text,
    p_keep interval
)
returns keel.tenant_retention
language plpgsql
volatile
-- SECURITY INVOKER, as keel.set_tenant_quota: the owner's own login, on Citus too.
set search_path = pg_catalog, pg_temp
as $$
declare
    v_row keel.tenant_retention;
    -- A value, not now() in the upsert: Citus takes only IMMUTABLE functions in its SET.
    v_now timestamptz := now();
begin
    perform keel.require_tenant(p_tenant_id);
    if p_setting is null
        or p_setting not in (
            'retain_finished_tasks', 'retain_closed_sessions', 'retain_old_checkpoints',
            'retain_delivered_messages', 'retain_dead_messages', 'retain_inbox'
        ) then
        raise exception using
            errcode = '22K01',
            message = format('no retention period %s', coalesce(p_setting, 'null')),
            hint = 'One of retain_finished_tasks, retain_closed_sessions, retain_old_checkpoints, retain_delivered_messages, retain_dead_messages, retain_inbox.';
    end if;
    if p_keep is null then
        delete from keel.tenant_retention as r
        where r.tenant_id = p_tenant_id and r.setting = p_setting
        returning r.* into v_row;
    elsif p_keep < interval '0' or p_keep > interval '100 years' then
        raise exception using
            errcode = '22K01',
            message = format('a retention period is 0 to 100 years, not %s', p_keep);
    else
        insert into keel.tenant_retention as r (tenant_id, setting, keep, updated_at)
        values (p_tenant_id, p_setting, p_keep, v_now)
        on conflict on constraint tenant_retention_pkey
        do update set keep = excluded.keep, updated_at = excluded.updated_at
        returning r.* into v_row;
    end if;
    return v_row;
end;
$$;

comment on function keel.set_tenant_retention(uuid, text, interval) is
'Sets tenant p_tenant_id''s own retention period p_setting to p_keep, 0 to 100 years (0 purges at the next keel.purge, 100 years keeps for good), in place of the keel.settings row for that tenant alone; null removes it. Returns the row written, or the one removed. The owner''s alone, like keel.set_tenant_quota (G11).';
