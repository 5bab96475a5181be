-- Tenant deletion (G10): delete a tenant in bounded steps, one transaction per call, and
-- resume wherever the last call stopped (the state is in the database, so a crash or a
-- killed call loses nothing: the next call carries on).
-- agentkeel:requires functions/delete_tenant_rows.sql
-- The first call destroys the tenant's data keys (crypto-shredding: its checkpoint
-- payloads are unreadable from then on, wherever a copy of them is), records the
-- deletion in keel.tenant_deletions, and marks the tenant deleting, after which every
-- API call for it is refused (keel.require_tenant, 55K17). Every call then removes at
-- most p_batch rows (keel.delete_tenant_rows). The call that finds nothing left takes
-- the tenant's row FOR UPDATE, which waits for every transaction that wrote a row of the
-- tenant and has not ended (each such write holds a FOR KEY SHARE lock on it, taken by
-- its foreign key), removes what they left, and removes the tenant's row: from then on a
-- write for it fails on its foreign key, whatever it checked before.
-- SECURITY INVOKER, owner only, as keel.destroy_tenant_data_keys.
create or replace function keel.delete_tenant(
    p_tenant_id uuid,
    p_events text default 'tombstone',
    p_batch integer default 1000
)
returns table (relation text, removed bigint, finished boolean)
language plpgsql
volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    v_now timestamptz := now();
    v_tenant keel.tenants;
    v_deletion keel.tenant_deletions;
    v_keys integer;
    v_left integer;
    v_counts jsonb := '{}';
    v_row record;
begin
    if p_events is null or p_events not in ('tombstone', 'remove') then
        raise exception using
            errcode = '22K01',
            message = format('events policy must be tombstone or remove, not %s', coalesce(p_events, 'null'));
    end if;
    if p_batch is null or p_batch not between 1 and 100000 then
        raise exception using
            errcode = '22K01',
            message = format('a deletion step removes 1 to 100000 rows, not %s', coalesce(p_batch::text, 'null'));
    end if;
    perform keel.adopt_tenant(p_tenant_id);
    -- One deleter at a time per tenant; writers (FOR KEY SHARE) are not waited for here.
    select t.* into v_tenant from keel.tenants as t where t.tenant_id = p_tenant_id for no key update;
    if not found then
        select d.* into v_deletion from keel.tenant_deletions as d where d.deleted_tenant_id = p_tenant_id;
        if v_deletion.finished_at is not null then
            relation := null;
            removed := 0;
            finished := true;
            return next;
            return;
        end if;
        raise exception using
            errcode = '42K02',
            message = 'no tenant with that id exists',
            detail = format('Tenant %s.', p_tenant_id);
    end if;
    select d.* into v_deletion from keel.tenant_deletions as d where d.deleted_tenant_id = p_tenant_id;
    if not found then
        v_keys := keel.destroy_tenant_data_keys(p_tenant_id);
        insert into keel.tenant_deletions (
            deleted_tenant_id, tenant_name, events, requested_at, requested_by, data_keys_destroyed
        )
        values (p_tenant_id, v_tenant.name, p_events, v_now, session_user, v_keys)
        returning * into v_deletion;
        update keel.tenants as t set deleting_since = v_now where t.tenant_id = p_tenant_id;
    elsif v_deletion.events <> p_events then
        raise exception using
            errcode = '22K01',
            message = format('this deletion runs with events = %s, not %s', v_deletion.events, p_events),
            hint = 'Resume a deletion with the policy it began with.';
    end if;

    v_left := p_batch;
    for v_row in select r.relation, r.removed from keel.delete_tenant_rows(p_tenant_id, p_events, v_left) as r loop
        v_left := v_left - v_row.removed;
        v_counts := v_counts || jsonb_build_object(v_row.relation, v_row.removed);
        relation := v_row.relation;
        removed := v_row.removed;
        finished := false;
        return next;
    end loop;
    if v_left > 0 then
        -- Nothing was left: wait for the writers still open, then take what they wrote.
        perform 1 from keel.tenants as t where t.tenant_id = p_tenant_id for update;
        for v_row in select r.relation, r.removed from keel.delete_tenant_rows(p_tenant_id, p_events, v_left) as r loop
            v_left := -1;
            v_counts := v_counts || jsonb_build_object(
                v_row.relation, coalesce((v_counts ->> v_row.relation)::bigint, 0) + v_row.removed
            );
            relation := v_row.relation;
            removed := v_row.removed;
            finished := false;
            return next;
        end loop;
    end if;
    if v_left > 0 then
        delete from keel.tenants as t where t.tenant_id = p_tenant_id;
        v_counts := v_counts || jsonb_build_object('keel.tenants', 1);
        relation := 'keel.tenants';
        removed := 1;
        finished := true;
        return next;
    end if;
    update keel.tenant_deletions as d
    set
        removed = (
            select coalesce(jsonb_object_agg(
                k.key, coalesce((d.removed ->> k.key)::bigint, 0) + coalesce((v_counts ->> k.key)::bigint, 0)
            ), '{}')
            from jsonb_object_keys(d.removed || v_counts) as k (key)
        ),
        finished_at = case when v_left > 0 then v_now end
    where d.deleted_tenant_id = p_tenant_id;
end;
$$;

comment on function keel.delete_tenant(uuid, text, integer) is
'Deletes a tenant (G10), at most p_batch rows per call, one transaction per call: call it until a row with finished = true comes back (agentkeel tenant delete does). The first call destroys the tenant''s data keys, records the deletion (keel.tenant_deletions, with p_events: tombstone keeps each task event without its payload in keel.task_event_tombstones, remove does not) and marks the tenant deleting, refused by every API call from then on (tenant_deleted, 55K17). Returns the rows removed per table by this call. Calling it again after the end returns finished; a resumed deletion must name the policy it began with (22K01). Owner only; an unknown tenant is 42K02.';
