-- Idempotency (G2): store the result of a reserved operation, fenced (G5).
create or replace function keel.complete_operation(
    p_tenant_id uuid,
    p_operation_id uuid,
    p_fencing_token bigint,
    p_result jsonb,
    p_provider_reference text default null
)
returns keel.operations
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    perform keel.require_tenant(p_tenant_id);
    if p_result is null then
        raise exception using
            errcode = '22K01',
            message = 'a result is required',
            hint = 'Pass ''{}''::jsonb when the effect has no result worth keeping.';
    end if;
    return keel.finish_operation(
        p_tenant_id, p_operation_id, p_fencing_token, 'succeeded', p_result, null,
        p_provider_reference
    );
end;
$$;

comment on function keel.complete_operation(uuid, uuid, bigint, jsonb, text) is
'Stores the result of a reserved operation (state succeeded); later replays of its key return it. Fenced by the task lease (lease_lost, 55K03); operation_not_reserved (55K05) if it already finished.';
