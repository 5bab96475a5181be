-- Idempotency (G2), a batch in one round trip: each item is one keel.reserve_operation call
-- with its own guarantees (a replay with the same input returns the stored outcome, one
-- with different input is idempotency_conflict and changes nothing), in a subtransaction
-- of its own. One tenant per call (CITUS.md rule 24).
-- agentkeel:requires functions/reserve_operation.sql
-- agentkeel:requires functions/check_batch.sql
create or replace function keel.reserve_operations(
    p_tenant_id uuid,
    p_items jsonb
)
returns table (
    item integer,
    idempotency_key text,
    refused_sqlstate text,
    refused_message text,
    outcome text,
    operation_id uuid,
    state text,
    attempts integer,
    result jsonb,
    error jsonb,
    provider_reference text,
    reserved_fencing_token bigint
)
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_item jsonb;
    v_index integer := 0;
    v_sqlstate text;
    v_message text;
begin
    perform keel.require_tenant(p_tenant_id);
    perform keel.check_batch(p_items, array['idempotency_key', 'action', 'input_hash']);
    for v_item in select i.value from jsonb_array_elements(p_items) as i (value) loop
        v_index := v_index + 1;
        item := v_index;
        idempotency_key := v_item ->> 'idempotency_key';
        begin
            select
                r.outcome, r.operation_id, r.state, r.attempts, r.result, r.error,
                r.provider_reference, r.reserved_fencing_token
            into
                outcome, operation_id, state, attempts, result, error,
                provider_reference, reserved_fencing_token
            from keel.reserve_operation(
                p_tenant_id,
                (v_item ->> 'task_id')::uuid,
                v_item ->> 'idempotency_key',
                v_item ->> 'action',
                v_item ->> 'input_hash',
                p_fencing_token => (v_item ->> 'fencing_token')::bigint,
                p_retention => coalesce((v_item ->> 'retention')::interval, interval '7 days'),
                p_trace_id => v_item ->> 'trace_id',
                p_span_id => v_item ->> 'span_id'
            ) as r;
            refused_sqlstate := null;
            refused_message := null;
        exception when others then
            get stacked diagnostics v_sqlstate = returned_sqlstate, v_message = message_text;
            refused_sqlstate := v_sqlstate;
            refused_message := v_message;
            outcome := null;
            operation_id := null;
            state := null;
            attempts := null;
            result := null;
            error := null;
            provider_reference := null;
            reserved_fencing_token := null;
        end;
        return next;
    end loop;
end;
$$;

comment on function keel.reserve_operations(uuid, jsonb) is
'A batch of keel.reserve_operation calls for one tenant in one round trip (G2). p_items is a jsonb array (at most settings.max_batch_items) of objects with idempotency_key, action, input_hash and optionally task_id, fencing_token, retention, trace_id, span_id. Each item runs in its own subtransaction with every guarantee of the single call; one result row per item, in order: the outcome (reserved, in_progress, succeeded, failed, ...) and the operation on success, else (refused_sqlstate, refused_message) the SQLSTATE and message the single call would have raised (idempotency_conflict 23K01, lease_lost 55K03, ...), with nothing written for that item. A malformed batch raises invalid_argument (22K01) and writes nothing.';
