-- Idempotency (G2): store the error of a reserved operation, fenced (G5).
create or replace function keel.fail_operation(
    p_tenant_id uuid,
    p_operation_id uuid,
    p_fencing_token bigint,
    p_error jsonb,
    p_retryable boolean default false,
    p_provider_reference text default null
)
returns keel.operations
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_state text := case when p_retryable then 'retryable' else 'failed' end;
begin
    perform keel.require_tenant(p_tenant_id);
    if p_error is null then
        raise exception using errcode = '22K01', message = 'an error description is required';
    end if;
    return keel.finish_operation(
        p_tenant_id, p_operation_id, p_fencing_token, v_state, null, p_error,
        p_provider_reference
    );
end;
$$;

comment on function keel.fail_operation(uuid, uuid, bigint, jsonb, boolean, text) is
'Stores the error of a reserved operation. Not retryable: state failed, replayed as stored. Retryable: the next reservation of the key with the same input starts another attempt. Fenced like keel.complete_operation.';
