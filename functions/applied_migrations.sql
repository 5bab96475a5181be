-- Safe migrations (G12): what was applied, readable by every keel role.
-- keel.migration_history is the migrator's own table (tools/agentkeel/migrate.py), owned by
-- keel_owner and granted to nobody. This function shows its columns that say what was
-- applied (not who applied it), so that `agentkeel migrate status` and the conformance
-- suite's G12 tests work as an application role too.
create or replace function keel.applied_migrations()
returns table (name text, kind text, version integer, checksum text, applied_at timestamptz)
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
begin atomic
    select
        h.name,
        h.kind,
        h.version,
        h.checksum,
        h.applied_at
    from keel.migration_history as h
    order by h.name;
end;

comment on function keel.applied_migrations() is
'Every applied agentkeel migration file: name, kind (versioned or repeatable), version, sha256 checksum, applied_at. Granted to every keel role, none of which may read keel.migration_history itself (G12).';
