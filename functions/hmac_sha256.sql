-- Tenant tokens and worker context proofs (G1): the one HMAC-SHA256, with the built-in
-- sha256() and no extension. Keys are stored as their two padded halves (key xor ipad, key
-- xor opad: keel.hmac_key_pads), so a signature is two sha256() calls.
create or replace function keel.hmac_sha256(p_inner bytea, p_outer bytea, p_message text)
returns text
language sql
immutable
strict
parallel safe
-- No SET search_path: granted to no role, it runs in its caller's pinned one.
return encode(sha256(p_outer || sha256(p_inner || convert_to(p_message, 'UTF8'))), 'hex');

comment on function keel.hmac_sha256(bytea, bytea, text) is
'HMAC-SHA256 of p_message (hex), given the key''s padded halves (keel.hmac_key_pads). Used by keel.tenant_token_signature and keel.context_proof_signature. Internal: EXECUTE is not granted to any application role.';
