#!/usr/bin/env bash
# run-tests.sh: what `make test` does.
#
#  1. go mod download; resolve the Kafka jars (Maven Central, cached per version);
#     PostgreSQL binaries come from apt-get when missing (postgres.sh does that);
#     python3 with venv, pip and pytest, and Debian's chromium, likewise; node and npm
#     (Node.js >= 20.3) must be there (apt-get installs them as root).
#  2. Start every test server that is not already running, all at once:
#     Kafka (19092), the SASL/SCRAM broker (19192), PostgreSQL (55432) and the
#     three-node cluster (29092-29097).
#  3. go test -race -count=1 ./... with MANDATED_TEST_* pointing at them.
#  4. Stop (down) only the servers step 2 started, also on failure or Ctrl-C, and
#     exit with go test's exit code.
#
# A server whose MANDATED_TEST_* variable is already set is not started: the tests
# use what the variable names. MANDATED_TEST_CLUSTER=0 leaves the cluster out (its
# tests skip). GO_TEST_FLAGS adds flags (e.g. -v, -run X); TEST_PKGS defaults to ./...;
# GO_TEST_RACE set to empty drops -race (`make rebalance` measures uninstrumented binaries).
# GO_TEST_TIMEOUT (45m) is go test's per-package limit: test/fault (its scenarios two at a
# time, about 5 minutes) can pass go test's 10-minute default on a loaded machine.
# GORACE defaults to atexit_sleep_ms=0 (below). `make test-short` sets GO_TEST_FLAGS=-short
# and MANDATED_TEST_CLUSTER=0: docs/tests.md says what each tier runs.
set -uo pipefail
# shellcheck source=common.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$REPO_ROOT" || exit 1

t_all=$SECONDS
STARTED=() # names of the servers this run started, stopped on exit
declare -A UP_PID=() # name -> PID of its background "up"
LOGDIR=$STATE_ROOT/run-tests
mkdir -p "$LOGDIR"

phase() { log "$1: $2s"; }

# svc NAME ARGS...: run the script that manages server NAME.
svc() {
	local name=$1
	shift
	case $name in
	postgres) "$INFRA_DIR/postgres.sh" "$@" ;;
	kafka) "$INFRA_DIR/kafka.sh" "$@" ;;
	kafka-sasl) KAFKA_SASL=1 "$INFRA_DIR/kafka.sh" "$@" ;;
	cluster) "$INFRA_DIR/kafka-cluster.sh" "$@" ;;
	*) die "unknown server $name" ;;
	esac
}

# shellcheck disable=SC2317 # invoked by the EXIT trap
cleanup() {
	local code=$? name pid pids=()
	trap - EXIT INT TERM
	if [ "${#STARTED[@]}" -gt 0 ]; then
		local t0=$SECONDS
		# Let starts still under way finish first, so that down finds their PIDs.
		for pid in "${UP_PID[@]}"; do wait "$pid" 2>/dev/null; done
		for name in "${STARTED[@]}"; do
			svc "$name" down >"$LOGDIR/down-$name.log" 2>&1 &
			pids+=($!)
		done
		for pid in "${pids[@]}"; do wait "$pid" || code=1; done
		phase "stopped what this run started" $((SECONDS - t0))
	fi
	phase "make test total" $((SECONDS - t_all))
	exit "$code"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- 1. dependencies -----------------------------------------------------------
t0=$SECONDS
go mod download || die "go mod download failed"
phase "go mod download" $((SECONDS - t0))

t0=$SECONDS
"$INFRA_DIR/kafka-libs.sh" >/dev/null || die "could not resolve the Kafka jars"
phase "Kafka $KAFKA_VERSION jars" $((SECONDS - t0))

# The Python package's tests (gateway/python_test.go) need python3 with venv,
# pip and pytest; the console's browser tests (gateway/console) need Debian's
# chromium. Missing ones are installed (apt-get as root; pytest with pip, or
# Debian's python3-pytest where pip may not install into the system's python),
# else make test stops here saying what is missing: those tests fail, never skip.
t0=$SECONDS
command -v python3 >/dev/null || apt_install python3 python3-venv python3-pip
python3 -c 'import venv, ensurepip' 2>/dev/null || apt_install python3-venv
python3 -m pip --version >/dev/null 2>&1 || apt_install python3-pip
if ! python3 -c 'import pytest' 2>/dev/null; then
	python3 -m pip install --quiet pytest >&2 || apt_install python3-pytest
	python3 -c 'import pytest' 2>/dev/null || die "pytest is not importable by $(command -v python3)"
fi
command -v chromium >/dev/null || command -v chromium-browser >/dev/null || apt_install chromium
phase "python3, pytest, chromium" $((SECONDS - t0))

# The TypeScript package's tests (gateway/typescript_test.go, examples/langgraphjs-approval)
# need Node.js >= 20.3 with npm: each runs `npm ci` of its committed lockfile (the npm
# registry, through npm's cache) into a temporary directory. Missing ones come from apt-get
# as root, else make test stops here saying so: those tests fail, never skip.
t0=$SECONDS
command -v node >/dev/null && command -v npm >/dev/null || apt_install nodejs npm
node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 20 || (a === 20 && b >= 3) ? 0 : 1)' ||
	die "Node.js >= 20.3 is required by the TypeScript package's tests; found $(node --version)"
phase "node $(node --version), npm $(npm --version)" $((SECONDS - t0))

# --- 2. servers ------------------------------------------------------------------
# want NAME: start server NAME in the background unless it is running.
want() {
	local name=$1
	if svc "$name" status >/dev/null 2>&1; then
		log "$name: already running, using it (left running afterwards)"
		return
	fi
	STARTED+=("$name")
	(
		s=$SECONDS
		svc "$name" up >"$LOGDIR/up-$name.log" 2>&1
		rc=$?
		echo "$((SECONDS - s))" >"$LOGDIR/up-$name.seconds"
		exit "$rc"
	) &
	UP_PID[$name]=$!
}

# wait_up NAME: wait for the start of NAME; on failure print its output and fail.
declare -A WAITED=()
wait_up() {
	[ -z "${WAITED[$1]:-}" ] || return 0
	WAITED[$1]=1
	if wait "${UP_PID[$1]}"; then
		log "$1: started in $(cat "$LOGDIR/up-$1.seconds")s"
	else
		log "$1: failed to start; its output:"
		sed 's/^/    /' "$LOGDIR/up-$1.log" >&2
		die "test server $1 did not start"
	fi
}

t0=$SECONDS
if [ -z "${MANDATED_TEST_DATABASE_URL:-}" ]; then
	want postgres
	MANDATED_TEST_DATABASE_URL=$(svc postgres url)
	# PostgreSQL first: 55432 lies in the ephemeral port range, and the brokers' own
	# connections could otherwise take it before it is bound (postgres.sh also
	# reserves it when it can).
	[ -z "${UP_PID[postgres]:-}" ] || wait_up postgres
fi
if [ -z "${MANDATED_TEST_KAFKA_BROKERS:-}" ]; then
	want kafka
	MANDATED_TEST_KAFKA_BROKERS=$(svc kafka brokers)
fi
if [ -z "${MANDATED_TEST_KAFKA_SASL_BROKERS:-}" ]; then
	want kafka-sasl
	MANDATED_TEST_KAFKA_SASL_BROKERS=$(svc kafka-sasl brokers)
fi
MANDATED_TEST_CLUSTER=${MANDATED_TEST_CLUSTER:-1}
if [ "$MANDATED_TEST_CLUSTER" = 1 ] && [ -z "${MANDATED_TEST_CLUSTER_BROKERS:-}" ]; then
	want cluster
	MANDATED_TEST_CLUSTER_BROKERS=$(svc cluster brokers)
fi

for name in "${!UP_PID[@]}"; do wait_up "$name"; done
[ "${#UP_PID[@]}" = 0 ] || phase "servers started" $((SECONDS - t0))

export MANDATED_TEST_DATABASE_URL MANDATED_TEST_KAFKA_BROKERS MANDATED_TEST_KAFKA_SASL_BROKERS \
	MANDATED_TEST_CLUSTER MANDATED_TEST_CLUSTER_BROKERS
export MANDATED_TEST_KAFKA_SASL_USER=${MANDATED_TEST_KAFKA_SASL_USER:-${KAFKA_SASL_USER:-mandated}}
export MANDATED_TEST_KAFKA_SASL_PASSWORD=${MANDATED_TEST_KAFKA_SASL_PASSWORD:-${KAFKA_SASL_PASSWORD:-mandated-secret}}
env | grep '^MANDATED_TEST_' | grep -v PASSWORD | sort | sed 's/^/    /' >&2

# --- 3. tests ------------------------------------------------------------------
# The race detector sleeps a second before every instrumented binary exits, to let
# goroutines still running report a race: a second per test binary (44 of them, two
# at a time), proving nothing the packages' goleak checks do not (no goroutine of a
# test outlives it). The binaries the tests start (mandated, mandatectl) keep theirs.
export GORACE=${GORACE:-atexit_sleep_ms=0}
# go test runs the packages in the order given, as many at once as there are cores
# (-p): the longest first, so that none of them starts last and runs alone at the end.
# A package named here that no longer exists is left out; every other one follows.
# Measured (docs/tests.md): the full tier's longest, then the short tier's.
LONGEST_FIRST="test/fault processor examples/langgraph-approval test/e2e gateway outbox
	examples/langgraphjs-approval verify cmd/mandatectl test/deploy client test/dev mcpguard sink"
if [ -z "${TEST_PKGS:-}" ]; then
	module=$(go list -m)
	all=$(go list ./...) || die "go list ./... failed"
	TEST_PKGS=""
	for p in $LONGEST_FIRST; do
		grep -qxF "$module/$p" <<<"$all" && TEST_PKGS+=" ./$p"
	done
	TEST_PKGS+=" $(grep -vxF -f <(printf "$module/%s\n" $LONGEST_FIRST) <<<"$all" | tr '\n' ' ')"
fi
t0=$SECONDS
# shellcheck disable=SC2086 # GO_TEST_FLAGS and TEST_PKGS are word lists
go test ${GO_TEST_RACE--race} -count=1 -timeout "${GO_TEST_TIMEOUT:-45m}" ${GO_TEST_FLAGS:-} $TEST_PKGS
rc=$?
phase "go test ${GO_TEST_RACE--race}" $((SECONDS - t0))
exit "$rc"
