#!/usr/bin/env bash
# bench.sh: what `make bench` does.
#
# Starts a Kafka 4.4 broker and two PostgreSQL 15 servers of the benchmark's own
# (127.0.0.1:49092, :55499 and :55500, state in .infra/bench-kafka, .infra/bench-pg and
# .infra/bench-pg2; the second holds the second shard of the 2-shard S1), builds and
# runs test/bench/cmd/benchrun, and stops and deletes the servers at the end, also on
# failure or Ctrl-C. It never touches the test servers (19092, 19192, 29092-29097,
# 55432) or a developer's own (39092, 45432).
#
# QUICK=1 runs the quick variant (about 4 minutes). BENCH_ARGS adds benchrun flags,
# e.g. BENCH_ARGS='--records 100000'. The report lands in
# test/bench/results/<date>-<full|quick>/ and a line is appended to
# test/bench/results/history.jsonl.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$(pwd)
# shellcheck disable=SC2034 # read by common.sh's log
SCRIPT_NAME=bench.sh
# shellcheck source=test/infra/common.sh
. test/infra/common.sh

export KAFKA_PORT=49092 KAFKA_DIR=$ROOT/.infra/bench-kafka
export PG_PORT=55499 PG_DIR=$ROOT/.infra/bench-pg
# The second PostgreSQL (same script, same durability settings): shard b of the 2-shard S1.
PG2_PORT=55500 PG2_DIR=$ROOT/.infra/bench-pg2
pg2() { PG_PORT=$PG2_PORT PG_DIR=$PG2_DIR test/infra/postgres.sh "$@"; }
WORK=$ROOT/.infra/bench-work

command -v gnuplot >/dev/null || (apt_install gnuplot-nox) || log "no gnuplot: the report will have no plots"
command -v pgbench >/dev/null || [ -x /usr/lib/postgresql/15/bin/pgbench ] || apt_install postgresql-client
PGBENCH=$(command -v pgbench || echo /usr/lib/postgresql/15/bin/pgbench)

stop_servers() {
	test/infra/kafka.sh down >/dev/null 2>&1 || true
	test/infra/postgres.sh down >/dev/null 2>&1 || true
	pg2 down >/dev/null 2>&1 || true
}
trap stop_servers EXIT
# A fresh broker and database cluster every run: leftovers of an aborted run go first.
stop_servers
mkdir -p "$WORK"
log "building benchrun"
go build -o "$WORK/benchrun" ./test/bench/cmd/benchrun
log "starting PostgreSQL on $PG_PORT and $PG2_PORT and Kafka on $KAFKA_PORT"
test/infra/postgres.sh up
pg2 up
test/infra/kafka.sh up

args=(run --brokers "127.0.0.1:$KAFKA_PORT"
	--database-url "postgres://postgres@127.0.0.1:$PG_PORT/postgres?sslmode=disable"
	--pg-data "$(readlink -m "$PG_DIR")/data"
	--database-url-2 "postgres://postgres@127.0.0.1:$PG2_PORT/postgres?sslmode=disable"
	--pg-data-2 "$(readlink -m "$PG2_DIR")/data" --kafka-pid-file "$KAFKA_DIR/kafka.pid"
	--results test/bench/results --work "$WORK" --pgbench "$PGBENCH")
if [ "${QUICK:-0}" = 1 ]; then args+=(--quick); fi
# shellcheck disable=SC2206 # BENCH_ARGS is a list of flags
args+=(${BENCH_ARGS:-})
"$WORK/benchrun" "${args[@]}"
