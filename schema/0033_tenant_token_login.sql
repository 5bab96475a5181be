-- Tenant tokens (G1) may be bound to the agent login they are minted for:
-- keel.mint_tenant_token takes p_login (functions/mint_tenant_token.sql), whose next run
-- creates it again with the third, defaulted argument. The two-argument version goes first,
-- or a call with two arguments would match both; existing callers keep working unchanged.
-- agentkeel:allow squawk.ban-drop-function (re-created with a defaulted argument in the same transaction)
drop function if exists keel.mint_tenant_token(uuid, interval);
