-- Checkpoint encryption (G9, G10): a tenant's data key, as stored: wrapped.
create or replace function keel.tenant_data_key(p_tenant_id uuid, p_key_version integer default null)
returns table (key_version integer, wrapped_key bytea, wrapping_key_id text)
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
    v_key keel.tenant_data_keys;
begin
    perform keel.require_tenant(p_tenant_id);
    if p_key_version is null then
        -- The active key: the newest version that is not destroyed, or no row.
        return query
        select k.key_version, k.wrapped_key, k.wrapping_key_id
        from keel.tenant_data_keys as k
        where k.tenant_id = p_tenant_id and k.destroyed_at is null
        order by k.key_version desc
        limit 1;
        return;
    end if;
    select k.* into v_key
    from keel.tenant_data_keys as k
    where k.tenant_id = p_tenant_id and k.key_version = p_key_version;
    if not found then
        raise exception using
            errcode = '42K11',
            message = format('data key version %s not found', p_key_version);
    end if;
    if v_key.destroyed_at is not null then
        raise exception using
            errcode = '55K10',
            message = format('data key version %s was destroyed', p_key_version),
            detail = format('Destroyed at %s: what it encrypted cannot be read.', v_key.destroyed_at);
    end if;
    return query select v_key.key_version, v_key.wrapped_key, v_key.wrapping_key_id;
end;
$$;

comment on function keel.tenant_data_key(uuid, integer) is
'The tenant''s data key version p_key_version as stored, wrapped by the key provider (G9); with no version, the active one (the newest not destroyed), or no row. Raises data_key_not_found (42K11) for an unknown version and data_key_destroyed (55K10) for a destroyed one (G10). The database never holds the unwrapped key.';
