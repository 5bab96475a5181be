-- Ownership (G1): keel_owner owns every keel object, so no application role owns one.
do $$
declare
    v_object record;
begin
    execute 'alter schema keel owner to keel_owner';
    for v_object in
        select
            c.oid::regclass::text as name,
            case c.relkind
                when 'v' then 'view'
                when 'm' then 'materialized view'
                when 'S' then 'sequence'
                when 'f' then 'foreign table'
                else 'table'
            end as kind
        from pg_catalog.pg_class as c
        inner join pg_catalog.pg_namespace as n on c.relnamespace = n.oid
        where n.nspname = 'keel'
            and c.relkind in ('r', 'p', 'v', 'm', 'S', 'f')
            and c.relowner <> 'keel_owner'::regrole
            -- A sequence owned by a column (serial: deptype 'a', identity: 'i') follows its
            -- table's owner; ALTER SEQUENCE ... OWNER refuses it (SQLSTATE 0A000).
            and not exists (
                select
                from pg_catalog.pg_depend as d
                where d.classid = 'pg_catalog.pg_class'::regclass
                    and d.objid = c.oid
                    and d.refclassid = 'pg_catalog.pg_class'::regclass
                    and d.deptype in ('a', 'i')
                    and c.relkind = 'S'
            )
        order by c.relkind = 'S'
    loop
        execute format('alter %s %s owner to keel_owner', v_object.kind, v_object.name);
    end loop;
    for v_object in
        select
            p.oid::regprocedure::text as name,
            case p.prokind when 'p' then 'procedure' when 'a' then 'aggregate' else 'function' end as kind
        from pg_catalog.pg_proc as p
        inner join pg_catalog.pg_namespace as n on p.pronamespace = n.oid
        where n.nspname = 'keel' and p.proowner <> 'keel_owner'::regrole
    loop
        execute format('alter %s %s owner to keel_owner', v_object.kind, v_object.name);
    end loop;
end;
$$;
