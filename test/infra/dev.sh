#!/usr/bin/env bash
# dev.sh: `make dev`. A whole mandated on this machine, ready for the README's
# first examples, stopped again on Ctrl-C:
#
#  1. builds mandated, mandate-gateway and mandatectl into .infra/dev/bin;
#  2. starts a Kafka broker (127.0.0.1:39092, the jars from Maven Central) and a
#     PostgreSQL (127.0.0.1:55434) of its own, with the test servers' scripts,
#     unless DEV_BROKERS / DEV_DATABASE_URL name servers that already run;
#  3. creates the four topics (3 partitions) and migrates the schema;
#  4. starts mandated (ops on :8080) and mandate-gateway (API and console on :8090,
#     ops on :8091) and waits until both answer /readyz;
#  5. creates an API token for org acme, an operator token for the console, and
#     grants the sample mandates acme/refund-case-1842, -1843 and -1844 (each one
#     refund of at most 200.00 EUR to customer-77: the README's curl, Python and Go
#     snippets spend the first under one intent, the LangGraph one the second, the
#     TypeScript one the third);
#  6. writes .infra/dev/env (TOKEN, OPERATOR_TOKEN, MANDATED_GATEWAY_URL, …, and
#     .infra/dev/bin on PATH for mandatectl) and prints the next three things to
#     type; then waits. Ctrl-C (or SIGTERM) stops the two processes and the servers
#     it started, deletes their state (and gives back a port it reserved), and
#     exits 0: a stop that was asked for is not an error.
#
# Environment: DEV_DIR (.infra/dev), DEV_KAFKA_PORT (39092), DEV_PG_PORT (55434),
# DEV_GATEWAY_ADDR (127.0.0.1:8090), DEV_GATEWAY_OPS_ADDR (127.0.0.1:8091),
# DEV_MANDATED_ADDR (127.0.0.1:8080), DEV_BROKERS, DEV_DATABASE_URL, DEV_TOPIC_PREFIX
# (empty: the default topic names), DEV_DETACH=1 (start, print, exit 0 and leave
# everything running; `test/infra/dev.sh down` stops it).
set -euo pipefail
# shellcheck source=common.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$REPO_ROOT"

DEV_DIR=${DEV_DIR:-$STATE_ROOT/dev}
DEV_KAFKA_PORT=${DEV_KAFKA_PORT:-39092}
DEV_PG_PORT=${DEV_PG_PORT:-55434}
DEV_GATEWAY_ADDR=${DEV_GATEWAY_ADDR:-127.0.0.1:8090}
DEV_GATEWAY_OPS_ADDR=${DEV_GATEWAY_OPS_ADDR:-127.0.0.1:8091}
DEV_MANDATED_ADDR=${DEV_MANDATED_ADDR:-127.0.0.1:8080}
DEV_TOPIC_PREFIX=${DEV_TOPIC_PREFIX:-}
BIN=$DEV_DIR/bin

kafka_env() { KAFKA_PORT=$DEV_KAFKA_PORT KAFKA_DIR=$DEV_DIR/kafka "$INFRA_DIR/kafka.sh" "$@"; }
pg_env() { PG_PORT=$DEV_PG_PORT PG_DIR=$DEV_DIR/pg "$INFRA_DIR/postgres.sh" "$@"; }

# stop_procs: SIGTERM the processes this script started (their PID files), then
# SIGKILL what is still there after 20 s.
stop_procs() {
	local name pid
	for name in mandate-gateway mandated; do
		[ -f "$DEV_DIR/$name.pid" ] || continue
		pid=$(cat "$DEV_DIR/$name.pid")
		# Only a process whose command line is ours.
		if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "$BIN/$name"; then
			kill -TERM "$pid" 2>/dev/null || true
			for _ in $(seq 1 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
			kill -KILL "$pid" 2>/dev/null || true
		fi
		rm -f "$DEV_DIR/$name.pid"
	done
}

down() {
	stop_procs
	if [ -f "$DEV_DIR/started" ]; then
		grep -qx kafka "$DEV_DIR/started" && kafka_env down >&2 || true
		grep -qx postgres "$DEV_DIR/started" && pg_env down >&2 || true
	fi
	rm -rf "$DEV_DIR"
	log "dev: stopped"
}

if [ "${1:-}" = down ]; then
	down
	exit 0
fi
if [ -f "$DEV_DIR/mandated.pid" ] && kill -0 "$(cat "$DEV_DIR/mandated.pid")" 2>/dev/null; then
	die "a dev stack already runs from $DEV_DIR (stop it with Ctrl-C in its terminal, or: test/infra/dev.sh down)"
fi
mkdir -p "$DEV_DIR" "$BIN"
: >"$DEV_DIR/started"

on_exit() {
	local code=$?
	trap - EXIT INT TERM
	if [ "${DETACHED:-0}" != 1 ]; then
		echo >&2
		down
	fi
	exit "$code"
}
trap on_exit EXIT
# A stop that was asked for (Ctrl-C, SIGTERM) cleans up and ends with 0, so that
# make does not report it as a failure.
trap 'exit 0' INT TERM

log "dev: building mandated, mandate-gateway, mandatectl"
go build -o "$BIN/" ./cmd/mandated ./cmd/mandate-gateway ./cmd/mandatectl

if [ -z "${DEV_DATABASE_URL:-}" ]; then
	pg_env up >&2
	echo postgres >>"$DEV_DIR/started"
	DEV_DATABASE_URL=$(pg_env url)
fi
if [ -z "${DEV_BROKERS:-}" ]; then
	log "dev: starting Kafka on 127.0.0.1:$DEV_KAFKA_PORT (the first start resolves its jars from Maven Central)"
	kafka_env up >&2
	echo kafka >>"$DEV_DIR/started"
	DEV_BROKERS=$(kafka_env brokers)
fi

# Every binary reads its flags from MANDATED_* as well.
export MANDATED_BROKERS=$DEV_BROKERS MANDATED_DATABASE_URL=$DEV_DATABASE_URL MANDATED_LOG_FORMAT=json
if [ -n "$DEV_TOPIC_PREFIX" ]; then
	export MANDATED_PROPOSALS_TOPIC=${DEV_TOPIC_PREFIX}mandate.proposals MANDATED_GRANTS_TOPIC=${DEV_TOPIC_PREFIX}mandate.grants \
		MANDATED_DECISIONS_TOPIC=${DEV_TOPIC_PREFIX}mandate.decisions MANDATED_DEAD_LETTER_TOPIC=${DEV_TOPIC_PREFIX}mandate.deadletter
fi
ctl() { "$BIN/mandatectl" "$@"; }

ctl topics create --partitions 3 --replication-factor 1 >&2
ctl migrate >&2

# start NAME LOG ARGS...: run a binary in the background, its PID in DEV_DIR.
start() {
	local name=$1 logf=$2
	shift 2
	"$BIN/$name" "$@" >"$logf" 2>&1 &
	echo $! >"$DEV_DIR/$name.pid"
}
# ready URL NAME LOG: wait (90 s) until URL answers 200.
ready() {
	local url=$1 name=$2 logf=$3 i
	for i in $(seq 1 450); do
		if curl -fsS -o /dev/null "$url" 2>/dev/null; then
			log "dev: $name ready ($url)"
			return 0
		fi
		kill -0 "$(cat "$DEV_DIR/$name.pid")" 2>/dev/null || { tail -n 30 "$logf" >&2; die "$name exited"; }
		sleep 0.2
	done
	tail -n 30 "$logf" >&2
	die "$name did not answer $url within 90 s"
}

start mandated "$DEV_DIR/mandated.log" --http-addr "$DEV_MANDATED_ADDR"
ready "http://$DEV_MANDATED_ADDR/readyz" mandated "$DEV_DIR/mandated.log"
start mandate-gateway "$DEV_DIR/mandate-gateway.log" --http-addr "$DEV_GATEWAY_ADDR" --ops-addr "$DEV_GATEWAY_OPS_ADDR"
ready "http://$DEV_GATEWAY_OPS_ADDR/readyz" mandate-gateway "$DEV_DIR/mandate-gateway.log"

TOKEN=$(ctl tokens create acme --name dev | tail -n 1)
OPERATOR_TOKEN=$(ctl tokens create --operator --name dev | tail -n 1)
for mandate in refund-case-1842 refund-case-1843 refund-case-1844; do
	ctl grant --org acme --mandate "$mandate" --key "dev-grant-$mandate" \
		--operation payment.refund --max-amount 20000 --currency EUR --uses 1 \
		--target customer-77 --valid-until 7d >&2
done

GATEWAY_URL=http://$DEV_GATEWAY_ADDR
cat >"$DEV_DIR/env" <<EOF
export TOKEN=$TOKEN
export OPERATOR_TOKEN=$OPERATOR_TOKEN
export MANDATED_GATEWAY_URL=$GATEWAY_URL
export MANDATED_GATEWAY_TOKEN=$TOKEN
export MANDATED_BROKERS=$DEV_BROKERS
export MANDATED_DATABASE_URL=$DEV_DATABASE_URL
export PATH=$(readlink -m "$BIN"):\$PATH
EOF
if [ -n "$DEV_TOPIC_PREFIX" ]; then
	cat >>"$DEV_DIR/env" <<EOF
export MANDATED_PROPOSALS_TOPIC=$MANDATED_PROPOSALS_TOPIC MANDATED_GRANTS_TOPIC=$MANDATED_GRANTS_TOPIC
export MANDATED_DECISIONS_TOPIC=$MANDATED_DECISIONS_TOPIC MANDATED_DEAD_LETTER_TOPIC=$MANDATED_DEAD_LETTER_TOPIC
EOF
fi

if [ "${DEV_DETACH:-0}" = 1 ]; then
	STOP="It runs on after this script: test/infra/dev.sh down stops everything."
else
	STOP="Ctrl-C stops everything."
fi
cat <<EOF

mandated is running: Kafka $DEV_BROKERS, PostgreSQL $DEV_DATABASE_URL,
mandated (ops http://$DEV_MANDATED_ADDR), mandate-gateway ($GATEWAY_URL, ops http://$DEV_GATEWAY_OPS_ADDR).
Org acme has the mandates refund-case-1842, -1843 and -1844: each one refund of at most
200.00 EUR to customer-77. Logs: $DEV_DIR/*.log. $STOP

Next, in another terminal:

  1. source $DEV_DIR/env      # TOKEN, OPERATOR_TOKEN, MANDATED_GATEWAY_URL; mandatectl on PATH
     then the README's curl: one call for one decision
  2. python3 -m venv .venv && . .venv/bin/activate && pip install ./clients/python
     python3 examples/quickstart.py
     (the README's Python block, as written: one execution however often it runs)
  3. the console: $GATEWAY_URL/console  (sign in with the operator token:
     $OPERATOR_TOKEN)

EOF

if [ "${DEV_DETACH:-0}" = 1 ]; then
	DETACHED=1
	exit 0
fi
# Wait for Ctrl-C, or for one of the two processes to end.
while kill -0 "$(cat "$DEV_DIR/mandated.pid")" 2>/dev/null && kill -0 "$(cat "$DEV_DIR/mandate-gateway.pid")" 2>/dev/null; do
	sleep 1
done
log "dev: a process ended; its log:"
tail -n 20 "$DEV_DIR"/*.log >&2
exit 1
