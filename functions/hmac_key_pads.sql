-- Tenant tokens and worker context proofs (G1): a new random HMAC key, as the two padded
-- halves that keel.hmac_sha256 takes: 64 bytes from four version-4 uuids (488 random
-- bits from PostgreSQL's cryptographic source), so no extension is needed.
create or replace function keel.hmac_key_pads(out inner_key bytea, out outer_key bytea)
language plpgsql
volatile
-- No SET search_path: granted to no role, it runs in its caller's pinned one.
as $$
declare
    v_key bytea := decode(
        replace(
            gen_random_uuid()::text || gen_random_uuid()::text
            || gen_random_uuid()::text || gen_random_uuid()::text,
            '-', ''
        ),
        'hex'
    );
begin
    inner_key := v_key;
    outer_key := v_key;
    for i in 0..63 loop
        inner_key := set_byte(inner_key, i, get_byte(v_key, i) # 54);
        outer_key := set_byte(outer_key, i, get_byte(v_key, i) # 92);
    end loop;
end;
$$;

comment on function keel.hmac_key_pads() is
'A new random 64-byte HMAC key as (key xor ipad, key xor opad), the form the key tables store and keel.hmac_sha256 takes. Used by keel.rotate_tenant_token_key and keel.rotate_context_key. Internal: EXECUTE is not granted to any application role.';
