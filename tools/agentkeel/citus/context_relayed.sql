-- Tenant isolation (G1), on Citus: is this transaction one another node relayed here?
-- Installed by `agentkeel distribute`, before the keel.context_stamp variant that calls it
-- (the variants are installed in file name order). It has no counterpart on PostgreSQL.
-- A coordinator runs its part of a distributed transaction on each worker over a
-- connection of its own: BEGIN, the SET LOCALs made so far in the transaction, then
-- assign_distributed_transaction_id(initiator group, number, ...), all before any query.
-- So a worker transaction carrying a distributed transaction id whose initiator is
-- another node's group was opened by that node, and a keel.context_stamp set in it
-- arrived as a propagated SET LOCAL: it is the stamp of the initiator's transaction
-- (its now(), not this node's), bound there by keel.bind_tenant_context.
-- Stable, so that keel.current_tenant(), which inlines keel.context_stamp(), stays a
-- stable expression an index scan evaluates once. Returns false where Citus is not
-- installed (the variants then behave as the shipped functions).
create or replace function keel.context_relayed()
returns boolean
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_initiator integer;
    v_number bigint;
    v_local integer;
begin
    if pg_catalog.to_regprocedure('pg_catalog.get_current_transaction_id()') is null
        or pg_catalog.to_regclass('pg_catalog.pg_dist_local_group') is null then
        return false;
    end if;
    select t.initiator_node_identifier, t.transaction_number
    into v_initiator, v_number
    from pg_catalog.get_current_transaction_id() as t;
    select g.groupid into v_local from pg_catalog.pg_dist_local_group as g;
    -- transaction number 0: no distributed transaction id (not relayed, or not yet
    -- assigned on the node that initiates it).
    return coalesce(v_number, 0) <> 0 and v_initiator is distinct from v_local;
end;
$$;

comment on function keel.context_relayed() is
'Citus variant (installed by agentkeel distribute, no counterpart on PostgreSQL): true when the current transaction carries a Citus distributed transaction id initiated by another node, i.e. it is a worker''s part of a transaction another node began, whose SET LOCALs that node propagated here. Read by the keel.context_stamp variant (G1). False without Citus.';
