-- Worker context proofs (G1, Citus): the signature of a proof, keys never leave the table.
create or replace function keel.context_proof_signature(p_key_version integer, p_message text)
returns text
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_key keel.context_keys;
begin
    select k.* into v_key
    from keel.context_keys as k
    where k.key_version = p_key_version and k.retired_at is null;
    if not found then
        return null;
    end if;
    return keel.hmac_sha256(v_key.inner_key, v_key.outer_key, p_message);
end;
$$;

comment on function keel.context_proof_signature(integer, text) is
'HMAC-SHA256 of p_message (hex) under context key p_key_version, or null when this node has no such active key. Internal: EXECUTE is not granted to any application role.';
