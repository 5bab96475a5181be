-- Tenant isolation (G1), on Citus: the stamp that ties a tenant context to one transaction.
-- Installed by `agentkeel distribute` in place of functions/context_stamp.sql.
-- agentkeel:requires functions/context_relayed.sql
-- keel.current_tenant() honours a context only while the setting keel.context_stamp
-- equals this function. On the node where the transaction began (the coordinator, or any
-- node a client connects to) that is, as on PostgreSQL, the transaction's own now(): a
-- value left at session level by an earlier transaction or pooled client is ignored.
-- On a worker, the coordinator's SET LOCAL keel.context_stamp arrives in the worker's
-- part of the distributed transaction and carries the coordinator's now(), never the
-- worker's: there (keel.context_relayed()) the propagated stamp is the transaction's
-- stamp. It reached the worker as a SET LOCAL, so it ends with this transaction too. A
-- session-level value left on such a connection would be honoured by a later relayed
-- transaction that binds no context of its own: no keel function leaves one (lint
-- citus.set_config); SQL a login smuggles onto its own worker connections could, and it
-- would then hold for that login's own later transactions only (a worker connection
-- belongs to one login: docs/citus.md), where it could have set the value itself.
-- A SQL function with a standard body, inlined into keel.current_tenant() and so into
-- every policy; keel.context_relayed() runs only when the stamp is not this node's.
create or replace function keel.context_stamp()
returns text
language sql
stable
return (
    case
        -- Unset, or this node's own stamp: nothing to ask Citus.
        when
            coalesce(pg_catalog.current_setting('keel.context_stamp', true), '')
            in ('', (extract(epoch from pg_catalog.now()))::text)
            then (extract(epoch from pg_catalog.now()))::text
        when keel.context_relayed() then pg_catalog.current_setting('keel.context_stamp', true)
        else (extract(epoch from pg_catalog.now()))::text
    end
);

comment on function keel.context_stamp() is
'Citus variant (installed by agentkeel distribute): this transaction''s stamp. Where the transaction began, now() as epoch seconds (as on PostgreSQL); on a worker running its part of a distributed transaction another node began (keel.context_relayed), the stamp that node propagated with SET LOCAL. keel.current_tenant() honours a tenant context only while keel.context_stamp equals it (G1).';
