-- Tenant isolation (G1), for Citus: is this transaction one another node relayed here?
-- Called only by the Citus variant of keel.context_stamp (tools/agentkeel/citus/), which
-- `agentkeel distribute` installs; shipped with the schema so that it exists, with its
-- grants, on every node before that variant calls it, and stays granted when a later
-- `migrate up` re-applies the privileges. On PostgreSQL alone it returns false.
-- A coordinator runs its part of a distributed transaction on each worker over a
-- connection of its own: BEGIN, the SET LOCALs made so far in the transaction, then
-- assign_distributed_transaction_id(initiator group, number, ...), all before any query;
-- the id is cleared when the transaction ends. So a transaction carrying a distributed
-- transaction id whose initiator is another node's group was opened by that node, and a
-- keel.context_stamp set in it arrived as a propagated SET LOCAL: the stamp of the
-- initiator's transaction (its now(), not this node's), bound there by
-- keel.bind_tenant_context.
-- Stable, so that keel.current_tenant(), which inlines the keel.context_stamp variant,
-- stays a stable expression an index scan evaluates once.
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
    -- Without Citus (its catalog table is missing): not relayed, and nothing below runs.
    if pg_catalog.to_regclass('pg_catalog.pg_dist_local_group') is null then
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
'True when the current transaction carries a Citus distributed transaction id initiated by another node, i.e. it is a worker''s part of a transaction another node began, whose SET LOCALs that node propagated here. Read by the Citus variant of keel.context_stamp (G1). False without Citus.';
