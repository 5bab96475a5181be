-- Quotas (G9): what one more step update would make of its session. Called under the
-- session row's lock (keel.record_session_update), so concurrent writers of one session
-- are counted one after the other and none slips past the limit.
create or replace function keel.check_session_quota(p_session keel.sessions, p_bytes bigint)
returns void
language plpgsql
stable
-- No SET search_path: granted to no role, it runs in its caller's pinned one.
as $$
declare
    v_max_updates bigint;
    v_max_bytes bigint;
begin
    select
        coalesce(max(s.value::bigint) filter (where s.setting = 'max_session_updates'), 10000),
        coalesce(
            max(s.value::bigint) filter (where s.setting = 'max_session_total_update_bytes'),
            16777216
        )
    into v_max_updates, v_max_bytes
    from keel.settings as s
    where s.setting in ('max_session_updates', 'max_session_total_update_bytes');
    if p_session.last_update_seq >= v_max_updates then
        raise exception using
            errcode = '54K01',
            message = format(
                'session %s has taken its %s step updates', p_session.session_id, v_max_updates
            ),
            detail = 'Nothing was written.',
            hint = 'Start a new session for new work; settings.max_session_updates sets the limit.';
    end if;
    if p_session.update_bytes + p_bytes > v_max_bytes then
        raise exception using
            errcode = '54K01',
            message = format(
                'session %s would hold %s bytes of step updates, over its %s',
                p_session.session_id, p_session.update_bytes + p_bytes, v_max_bytes
            ),
            detail = 'Nothing was written.',
            hint = 'Start a new session for new work; settings.max_session_total_update_bytes sets the limit.';
    end if;
end;
$$;

comment on function keel.check_session_quota(keel.sessions, bigint) is
'Raises quota_exceeded (54K01) when session p_session already holds settings.max_session_updates step updates (default 10,000), or when p_bytes more would take its update_bytes past settings.max_session_total_update_bytes (default 16 MiB). Shared by keel.record_session_update; not granted to any role.';
