-- Recovery points (G8, G9): store an encrypted checkpoint of a leased task, fenced (G5).
create or replace function keel.save_checkpoint(
    p_tenant_id uuid,
    p_task_id uuid,
    p_checkpoint_id uuid,
    p_fencing_token bigint,
    p_kind text,
    p_key_version integer,
    p_nonce bytea,
    p_ciphertext bytea,
    p_payload_hash text,
    p_schema_version integer default 1,
    p_step_key text default null,
    p_ttl interval default null
)
returns keel.checkpoints
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_now timestamptz := clock_timestamp();
    v_task keel.tasks;
    v_limit integer;
    v_expires timestamptz;
    v_destroyed timestamptz;
    v_seq integer;
    v_checkpoint keel.checkpoints;
    v_counted boolean;
begin
    perform keel.require_tenant(p_tenant_id);
    if p_checkpoint_id is null then
        raise exception using
            errcode = '22K01',
            message = 'a checkpoint id is required',
            hint = 'The client chooses it: it is bound into the ciphertext as associated data.';
    end if;
    if p_kind is null or p_kind !~ '^[A-Z][A-Z0-9_]{0,62}$' then
        raise exception using
            errcode = '22K01',
            message = 'checkpoint kind must be 1 to 63 upper-case letters, digits or underscores',
            hint = 'INPUT, TOOL_RESULT, SYNTHESIS, DELIVERY, or a workflow-defined kind in that form.';
    end if;
    if p_schema_version is null or p_schema_version < 1 then
        raise exception using errcode = '22K01', message = 'schema version must be 1 or more';
    end if;
    if p_step_key is not null and char_length(p_step_key) not between 1 and 200 then
        raise exception using errcode = '22K01', message = 'step key must be 1 to 200 characters';
    end if;
    if p_nonce is null or octet_length(p_nonce) <> 12 then
        raise exception using errcode = '22K01', message = 'the nonce must be 12 bytes (AES-GCM)';
    end if;
    if p_ciphertext is null or octet_length(p_ciphertext) < 16 then
        raise exception using
            errcode = '22K01',
            message = 'the ciphertext must hold at least the 16-byte AES-GCM tag';
    end if;
    select s.value::integer into v_limit
    from keel.settings as s
    where s.setting = 'max_checkpoint_payload_bytes';
    v_limit := coalesce(v_limit, 16777216);
    if octet_length(p_ciphertext) > v_limit then
        raise exception using
            errcode = '22K02',
            message = format(
                'checkpoint payload is %s bytes, over the limit of %s',
                octet_length(p_ciphertext), v_limit
            ),
            hint = 'Store large data as an artifact and checkpoint its reference; settings.max_checkpoint_payload_bytes sets the limit.';
    end if;
    if p_payload_hash is distinct from encode(sha256(p_ciphertext), 'hex') then
        raise exception using
            errcode = '22K01',
            message = 'the payload hash is not the sha256 of the ciphertext',
            hint = 'Pass the lower-case hex sha256 of the ciphertext bytes as sent.';
    end if;
    if p_ttl is not null then
        v_expires := keel.interval_end('checkpoint lifetime', p_ttl, v_now, interval '10 years');
    end if;

    -- The tenant's byte quota first, before any other row lock (keel.add_tenant_usage):
    -- a save that turns out to store nothing gives its bytes back below. A retried save of
    -- a stored checkpoint takes none, whatever the quota.
    v_counted := not exists (
        select 1
        from keel.checkpoints as c
        where c.tenant_id = p_tenant_id and c.checkpoint_id = p_checkpoint_id
    );
    if v_counted then
        perform keel.add_tenant_usage(p_tenant_id, 'checkpoint_bytes', octet_length(p_ciphertext));
    end if;

    -- FOR UPDATE: checkpoints of a task are numbered under its row lock, and no claim can
    -- move the lease until this commits (G5).
    v_task := keel.lock_task(p_tenant_id, p_task_id);
    perform keel.assert_lease(v_task, p_fencing_token, v_now);

    select k.destroyed_at into v_destroyed
    from keel.tenant_data_keys as k
    where k.tenant_id = p_tenant_id and k.key_version = p_key_version;
    if not found then
        raise exception using
            errcode = '42K11',
            message = format('data key version %s not found', p_key_version);
    end if;
    if v_destroyed is not null then
        raise exception using
            errcode = '55K10',
            message = format('data key version %s was destroyed', p_key_version),
            hint = 'Fetch the active key with keel.tenant_data_key, or add one with keel.add_tenant_data_key.';
    end if;

    -- A retried save of a stored checkpoint is answered below, whatever the quota.
    if v_counted then
        perform keel.check_quota(p_tenant_id, p_task_id, 'max_task_checkpoints', 1);
    end if;

    select coalesce(max(c.seq), 0) + 1 into v_seq
    from keel.checkpoints as c
    where c.tenant_id = p_tenant_id and c.task_id = p_task_id;

    insert into keel.checkpoints as c (
        tenant_id, checkpoint_id, task_id, seq, kind, step_key, schema_version, payload_hash,
        status, fencing_token, created_at, expires_at
    )
    values (
        p_tenant_id, p_checkpoint_id, p_task_id, v_seq, p_kind, p_step_key, p_schema_version,
        p_payload_hash, 'ok', p_fencing_token, v_now, v_expires
    )
    on conflict on constraint checkpoints_pkey do nothing
    returning c.* into v_checkpoint;

    if not found then
        -- Stored by a concurrent save meanwhile: the bytes counted above are given back.
        if v_counted then
            perform keel.add_tenant_usage(
                p_tenant_id, 'checkpoint_bytes', -octet_length(p_ciphertext)::bigint
            );
        end if;
        -- A retried save of the same checkpoint returns it; anything else is a conflict.
        select c.* into v_checkpoint
        from keel.checkpoints as c
        where c.tenant_id = p_tenant_id and c.checkpoint_id = p_checkpoint_id;
        if v_checkpoint.task_id <> p_task_id or v_checkpoint.payload_hash <> p_payload_hash then
            raise exception using
                errcode = '23K10',
                message = format(
                    'checkpoint %s was already saved with another task or payload',
                    p_checkpoint_id
                ),
                detail = 'The stored checkpoint was left unchanged.',
                hint = 'Use a new checkpoint id for a new payload.';
        end if;
        return v_checkpoint;
    end if;

    insert into keel.checkpoint_payloads (
        tenant_id, checkpoint_id, key_version, nonce, ciphertext
    )
    values (p_tenant_id, p_checkpoint_id, p_key_version, p_nonce, p_ciphertext);
    return v_checkpoint;
end;
$$;

comment on function keel.save_checkpoint(uuid, uuid, uuid, bigint, text, integer, bytea, bytea, text, integer, text, interval) is
'Stores a recovery point of a leased task (G8): its kind, schema version and the payload as ciphertext only (AES-GCM under the tenant''s data key p_key_version, made by the client: the database never sees plaintext, G9). p_payload_hash must be the sha256 hex of the ciphertext. Numbered per task (seq). p_ttl: it stops being offered for resuming after that. Saving the same checkpoint id again with the same payload returns it; with another, checkpoint_conflict (23K10). Fenced by the task lease (lease_lost, 55K03); data_key_destroyed (55K10) for a destroyed key; quota_exceeded (54K01) past the task''s max_task_checkpoints or the tenant''s max_tenant_checkpoint_bytes.';
