-- Worker context proofs (G1, Citus): add a key version for signing them, optionally
-- retiring the older ones. `agentkeel distribute` calls it once when no key exists, and
-- copies keel.context_keys to every worker; after a rotation, run distribute again.
create or replace function keel.rotate_context_key(p_retire_previous boolean default false)
returns integer
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_version integer;
    v_key record;
begin
    select * into v_key from keel.hmac_key_pads();
    lock table keel.context_keys in exclusive mode;
    select coalesce(max(k.key_version), 0) + 1 into v_version from keel.context_keys as k;
    if p_retire_previous then
        update keel.context_keys as k set retired_at = now() where k.retired_at is null;
    end if;
    insert into keel.context_keys (key_version, inner_key, outer_key)
    values (v_version, v_key.inner_key, v_key.outer_key);
    return v_version;
end;
$$;

comment on function keel.rotate_context_key(boolean) is
'Creates the next key version for worker context proofs, used from now on; with p_retire_previous, proofs signed by older keys stop verifying at once (on each node once agentkeel distribute has copied the change). keel_owner only.';
