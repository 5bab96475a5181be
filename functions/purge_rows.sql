-- Retention (G11): remove, within a budget of rows, the rows of p_relation that
-- p_condition selects, with every row that belongs to them, children first. What belongs
-- to a row is read from the catalog: the tenant tables with a foreign key (tenant_id,
-- column) to it, and the tables with such a key to those (a checkpoint's payload under a
-- task's checkpoint). Every candidate is locked FOR UPDATE SKIP LOCKED, in a MATERIALIZED
-- CTE (a LIMIT in an IN (subquery) may be run again by the plan and take more rows than
-- the budget); a parent one of whose rows was held, and so skipped, stays for a later step.
-- agentkeel:requires functions/tenant_deletion_order.sql
-- agentkeel:allow citus.set_local_autocommit (keel.purge = on is read on the shards by the append-only trigger: where it does not arrive, the delete of events is refused with 55K07, never silently partial; agentkeel purge runs each step in a transaction block)
create or replace function keel.purge_rows(
    p_tenant_id uuid,
    p_kind text,
    p_relation regclass,
    p_key text,
    p_condition text,
    p_now timestamptz,
    p_keep interval,
    p_budget integer
)
returns table (kind text, relation text, removed bigint)
language plpgsql
volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    v_left integer := p_budget;
    v_type text;
    v_keys text[];
    v_child record;
    v_count bigint;
    v_bytes bigint;
begin
    if v_left <= 0 then
        return;
    end if;
    select format_type(a.atttypid, a.atttypmod) into v_type
    from pg_catalog.pg_attribute as a
    where a.attrelid = p_relation and a.attname = p_key;
    execute format(
        'select array_agg(x.k::text) from (select x.%2$I as k from %1$s as x'
        ' where x.tenant_id = $1 and %3$s order by x.%2$I limit $4'
        ' for update of x skip locked) as x',
        p_relation, p_key, p_condition
    ) into v_keys using p_tenant_id, p_now, p_keep, v_left;
    if v_keys is null then
        return;
    end if;
    -- What belongs to the candidates: one level down (x.column names a candidate) or two
    -- (x.column names a row of a table one level down that belongs to a candidate).
    for v_child in
        with fks as (
            select
                k.conrelid,
                k.confrelid,
                (select a.attname from pg_catalog.pg_attribute as a
                 where a.attrelid = k.conrelid and a.attnum = k.conkey[2]) as col,
                (select a.attname from pg_catalog.pg_attribute as a
                 where a.attrelid = k.confrelid and a.attnum = k.confkey[2]) as refcol
            from pg_catalog.pg_constraint as k
            where
                k.contype = 'f' and cardinality(k.conkey) = 2
                and (select a.attname from pg_catalog.pg_attribute as a
                     where a.attrelid = k.conrelid and a.attnum = k.conkey[1]) = 'tenant_id'
        )

        select
            o.relation,
            o.key_columns,
            coalesce(
                (select format('x.%I = any($2::%s[])', f.col, v_type)
                 from fks as f
                 where f.conrelid = o.relation and f.confrelid = p_relation and f.refcol = p_key
                 limit 1),
                (select format(
                    'x.%I in (select y.%I from %s as y where y.tenant_id = $1 and y.%I = any($2::%s[]))',
                    f2.col, f2.refcol, f2.confrelid::regclass, f1.col, v_type
                 )
                 from fks as f2
                 inner join fks as f1 on f1.conrelid = f2.confrelid
                 where f2.conrelid = o.relation and f1.confrelid = p_relation and f1.refcol = p_key
                 limit 1)
            ) as filter,
            -- Rows something still refers to (held, so skipped) stay: deleting them would
            -- cascade into the held row and wait on it.
            (select coalesce(string_agg(format(
                ' and not exists (select 1 from %s as g where g.tenant_id = $1 and g.%I = x.%I)',
                f.conrelid::regclass, f.col, f.refcol
             ), ''), '')
             from fks as f
             where f.confrelid = o.relation and f.conrelid <> o.relation) as unreferenced
        from keel.tenant_deletion_order() as o
    loop
        continue when v_child.filter is null;
        exit when v_left <= 0;
        if v_child.relation = 'keel.task_events'::regclass then
            -- A statement, not set_config(): on Citus only SET LOCAL reaches the workers.
            set local keel.purge = on;
        end if;
        -- The bytes of the checkpoint payloads removed, for the tenant's byte quota.
        execute format(
            'with c as materialized (select %2$s from %1$s as x where x.tenant_id = $1 and %3$s%4$s'
            ' limit $3 for update of x skip locked),'
            ' d as (delete from %1$s as d where d.tenant_id = $1 and (%2$s) in (select %2$s from c)'
            ' returning %5$s as bytes)'
            ' select count(*), coalesce(sum(d.bytes), 0) from d',
            v_child.relation, v_child.key_columns, v_child.filter, v_child.unreferenced,
            case
                when v_child.relation = 'keel.checkpoint_payloads'::regclass
                    then 'octet_length(d.ciphertext)'
                else '0'
            end
        ) into v_count, v_bytes using p_tenant_id, v_keys, v_left;
        if v_child.relation = 'keel.task_events'::regclass then
            set local keel.purge = off;
        end if;
        -- Written beside the counter, never on it: a save of the tenant holds the counter's
        -- row lock to its commit, and a purge does not wait (keel.add_tenant_usage folds it).
        if v_bytes > 0 then
            insert into keel.tenant_usage_credits (tenant_id, counter, amount)
            values (p_tenant_id, 'checkpoint_bytes', v_bytes);
        end if;
        if v_count > 0 then
            v_left := v_left - v_count;
            kind := p_kind;
            relation := v_child.relation::text;
            removed := v_count;
            return next;
        end if;
    end loop;
    if v_left <= 0 then
        return;
    end if;
    -- The candidates nothing of is left (a row someone held was skipped), at most the budget.
    execute format(
        'with c as materialized (select x.%2$I from %1$s as x where x.tenant_id = $1'
        ' and x.%2$I = any($2::%3$s[])%4$s limit $3)'
        ' delete from %1$s as d where d.tenant_id = $1 and d.%2$I in (select c.%2$I from c)',
        p_relation, p_key, v_type,
        (select coalesce(string_agg(format(
            ' and not exists (select 1 from %s as g where g.tenant_id = $1 and g.%I = x.%I)',
            k.conrelid::regclass,
            (select a.attname from pg_catalog.pg_attribute as a
             where a.attrelid = k.conrelid and a.attnum = k.conkey[2]),
            (select a.attname from pg_catalog.pg_attribute as a
             where a.attrelid = k.confrelid and a.attnum = k.confkey[2])
         ), ''), '')
         from pg_catalog.pg_constraint as k
         where k.contype = 'f' and k.confrelid = p_relation and k.conrelid <> p_relation
             and cardinality(k.conkey) = 2)
    ) using p_tenant_id, v_keys, v_left;
    get diagnostics v_count = row_count;
    if v_count > 0 then
        kind := p_kind;
        relation := p_relation::text;
        removed := v_count;
        return next;
    end if;
end;
$$;

comment on function keel.purge_rows(uuid, text, regclass, text, text, timestamptz, interval, integer) is
'Internal to keel.purge (G11): removes at most p_budget rows: the rows of p_relation (keyed by tenant_id and p_key) that p_condition selects (over alias x, with $1 the tenant, $2 now and $3 the retention period), each with what belongs to it, children first, all locked SKIP LOCKED. Returns (kind, relation, removed) per table it removed rows from.';
