-- Recovery points (G8): the checkpoint to resume from, with its ciphertext and wrapped key.
create or replace function keel.latest_checkpoint(
    p_tenant_id uuid,
    p_task_id uuid,
    p_kind text default null
)
returns table (
    checkpoint_id uuid,
    task_id uuid,
    seq integer,
    kind text,
    step_key text,
    schema_version integer,
    payload_hash text,
    status text,
    fencing_token bigint,
    created_at timestamptz,
    expires_at timestamptz,
    key_version integer,
    nonce bytea,
    ciphertext bytea,
    wrapped_key bytea,
    wrapping_key_id text
)
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
    v_now timestamptz := clock_timestamp();
    v_checkpoint keel.checkpoints;
    v_payload keel.checkpoint_payloads;
    v_key keel.tenant_data_keys;
begin
    perform keel.require_tenant(p_tenant_id);
    select c.* into v_checkpoint
    from keel.checkpoints as c
    where c.tenant_id = p_tenant_id and c.task_id = p_task_id and c.status = 'ok'
        and (c.expires_at is null or c.expires_at > v_now)
        and (p_kind is null or c.kind = p_kind)
    order by c.seq desc
    limit 1;
    if not found then
        return;
    end if;
    select p.* into v_payload
    from keel.checkpoint_payloads as p
    where p.tenant_id = p_tenant_id and p.checkpoint_id = v_checkpoint.checkpoint_id;
    select k.* into v_key
    from keel.tenant_data_keys as k
    where k.tenant_id = p_tenant_id and k.key_version = v_payload.key_version;
    if v_key.destroyed_at is not null then
        raise exception using
            errcode = '55K10',
            message = format(
                'checkpoint %s is unreadable: data key version %s was destroyed',
                v_checkpoint.checkpoint_id, v_key.key_version
            ),
            detail = format('Destroyed at %s (G10).', v_key.destroyed_at);
    end if;
    return query select
        v_checkpoint.checkpoint_id, v_checkpoint.task_id, v_checkpoint.seq, v_checkpoint.kind,
        v_checkpoint.step_key, v_checkpoint.schema_version, v_checkpoint.payload_hash,
        v_checkpoint.status, v_checkpoint.fencing_token, v_checkpoint.created_at,
        v_checkpoint.expires_at, v_payload.key_version, v_payload.nonce, v_payload.ciphertext,
        v_key.wrapped_key, v_key.wrapping_key_id;
end;
$$;

comment on function keel.latest_checkpoint(uuid, uuid, text) is
'The newest valid checkpoint of the task (status ok, not expired; of kind p_kind when given), or no row, with its ciphertext, nonce, key version and the wrapped data key in one row, for the client to decrypt (G8, G9). Raises data_key_destroyed (55K10) when its key was destroyed (G10). Needs no lease: any worker about to resume may read it.';
