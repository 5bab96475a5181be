#!/usr/bin/env bash
# Instructions per operation of keel's hot paths, counted by valgrind (callgrind) in a
# single-user backend: the same count on a busy machine as on an idle one, so a change
# that saves 5% shows as 5% (agentkeel bench measures time; this, what the time is made of).
#   tools/dev/instructions.sh [checkout]   default: this checkout
# Prints, for claim + complete (claim_next_task, then transition_task to done, as a
# keel_worker login) and for a transition writing an event and an outbox message (as a
# keel_app login), the instructions per operation: the count of a run of 200 operations
# less that of a run of 100, over 100 (start-up and plan caching cancel out). Needs
# valgrind, the server binaries (pg_config --bindir, or PG_BINDIR) and, as root, the OS
# user postgres. Leaves nothing behind; with INSTRUCTIONS_KEEP=<folder>, the callgrind
# profiles stay there (callgrind_annotate reads them; the difference of the two runs of a
# workload is what its operations cost). INSTRUCTIONS_SQL=<file> runs that SQL as the
# superuser after the install, to count a change before writing it into the files.
set -euo pipefail
for tool in valgrind psql; do
  command -v "$tool" >/dev/null || { echo "instructions.sh: $tool is not installed" >&2; exit 2; }
done
checkout=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
bindir=${PG_BINDIR:-$(pg_config --bindir)}
agentkeel=${AGENTKEEL:-$checkout/.venv/bin/agentkeel}
work=$(mktemp -d /tmp/agentkeel-instructions-XXXXXX)
chmod 755 "$work"
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
if [ "$(id -u)" = 0 ]; then chown postgres "$work"; fi
port=$((20000 + RANDOM % 20000))
cleanup() { as_pg "$bindir/pg_ctl" -D "$work/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
as_pg "$bindir/initdb" -D "$work/data" -A trust -U postgres >/dev/null
as_pg "$bindir/pg_ctl" -D "$work/data" -l "$work/log" -w \
  -o "-p $port -c listen_addresses=127.0.0.1 -c unix_socket_directories=$work -c fsync=off" start >/dev/null
dsn="postgresql://postgres@127.0.0.1:$port/postgres"
(cd "$checkout" && PYTHONPATH="$checkout/tools" "$agentkeel" migrate up --dsn "$dsn" >/dev/null)
tenant=11111111-1111-1111-1111-111111111111
psql -X -q -v ON_ERROR_STOP=1 "$dsn" >/dev/null <<SQL
select keel.define_workflow('ins', 1, 'queued', '[["queued","done"],["queued","a"],["a","b"],["b","a"]]');
begin;
select set_config('keel.tenant_id', '$tenant', true), keel.bind_tenant_context();
select keel.create_tenant('$tenant', 'instructions');
insert into keel.tasks (tenant_id, task_id, workflow, workflow_version, state, wake_at)
select '$tenant', md5('ins-' || g)::uuid, 'ins', 1, 'queued', now() from generate_series(0, 1000) as g;
commit;
create role ins_worker login in role keel_worker;
create role ins_app login in role keel_app;
vacuum analyze keel.tasks;
SQL
# An experiment without editing the files: SQL of your own, run after the install.
if [ -n "${INSTRUCTIONS_SQL:-}" ]; then psql -X -q -v ON_ERROR_STOP=1 "$dsn" -f "$INSTRUCTIONS_SQL" >/dev/null; fi
as_pg "$bindir/pg_ctl" -D "$work/data" -m fast stop >/dev/null
claim() {
  echo "set session authorization ins_worker;"
  echo "do \$\$ declare r record; begin for i in 1..$1 loop select * into r from keel.claim_next_task('w1', '30 seconds', 'ins'); perform keel.transition_task(r.tenant_id, r.task_id, r.state_version, 'done', p_fencing_token => r.fencing_token); commit; end loop; end \$\$;"
}
transition() {
  echo "set session authorization ins_app;"
  echo "do \$\$ declare v bigint := 1; begin for i in 1..$1 loop select state_version into v from keel.transition_task('$tenant', md5('ins-0')::uuid, v, case when v % 2 = 1 then 'a' else 'b' end, p_payload => '{\"step\": \"bench\"}', p_outbox => '[{\"topic\": \"bench.moved\", \"payload\": {\"step\": \"bench\"}}]'); commit; end loop; end \$\$;"
}
count() {  # count <workload> <ops>: instructions of a backend running them on a fresh copy
  rm -rf "$work/run" && cp -a "$work/data" "$work/run"
  "$1" "$2" > "$work/ops.sql"
  as_pg valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.out" \
    "$bindir/postgres" --single -D "$work/run" -c fsync=off postgres < "$work/ops.sql" \
    > "$work/valgrind.log" 2>&1
  if grep -q "ERROR" "$work/valgrind.log"; then grep -m1 -A2 "ERROR" "$work/valgrind.log" >&2; exit 1; fi
  if [ -n "${INSTRUCTIONS_KEEP:-}" ]; then cp "$work/callgrind.out" "$INSTRUCTIONS_KEEP/callgrind.$1.$2.out"; fi
  n=$(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$work/valgrind.log")
  if [ -z "$n" ]; then echo "instructions.sh: no count from valgrind:" >&2; tail -3 "$work/valgrind.log" >&2; exit 1; fi
  echo "$n"
}
for workload in claim transition; do
  a=$(count $workload 100); b=$(count $workload 200)
  printf '%-12s %12s instructions per operation\n' "$workload" "$(( (b - a) / 100 ))"
done
