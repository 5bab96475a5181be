-- Checkpoint encryption (G9, G10): store a new data key for a tenant that has none active.
create or replace function keel.add_tenant_data_key(
    p_tenant_id uuid,
    p_wrapped_key bytea,
    p_wrapping_key_id text
)
returns table (key_version integer, wrapped_key bytea, wrapping_key_id text)
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
    v_now timestamptz := clock_timestamp();
    v_version integer;
begin
    perform keel.require_tenant(p_tenant_id);
    if p_wrapped_key is null or octet_length(p_wrapped_key) not between 40 and 1024 then
        raise exception using
            errcode = '22K01',
            message = 'a wrapped data key must be 40 to 1024 bytes';
    end if;
    if p_wrapping_key_id is null or char_length(p_wrapping_key_id) not between 1 and 200 then
        raise exception using
            errcode = '22K01',
            message = 'wrapping key id must be 1 to 200 characters';
    end if;
    perform 1 from keel.tenants as t where t.tenant_id = p_tenant_id;
    if not found then
        raise exception using errcode = '42K02', message = format('unknown tenant %s', p_tenant_id);
    end if;

    perform 1
    from keel.tenant_data_keys as k
    where k.tenant_id = p_tenant_id and k.destroyed_at is null;
    if not found then
        select coalesce(max(k.key_version), 0) + 1 into v_version
        from keel.tenant_data_keys as k
        where k.tenant_id = p_tenant_id;
        -- A concurrent first key wins; this one is dropped and the winner returned.
        insert into keel.tenant_data_keys (
            tenant_id, key_version, wrapped_key, wrapping_key_id, created_at
        )
        values (p_tenant_id, v_version, p_wrapped_key, p_wrapping_key_id, v_now)
        on conflict on constraint tenant_data_keys_pkey do nothing;
    end if;

    return query
    select k.key_version, k.wrapped_key, k.wrapping_key_id
    from keel.tenant_data_keys as k
    where k.tenant_id = p_tenant_id and k.destroyed_at is null
    order by k.key_version desc
    limit 1;
end;
$$;

comment on function keel.add_tenant_data_key(uuid, bytea, text) is
'Stores p_wrapped_key as the tenant''s next data key version when it has no active one, and returns the active key (G9). When one exists (made concurrently, say) the given key is dropped and the existing one returned: use what comes back. The key is wrapped by the client''s key provider; the database never sees it unwrapped.';
