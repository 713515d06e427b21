# shellcheck shell=bash
# common.sh: shared helpers for the throwaway test servers. Sourced by kafka.sh,
# kafka-cluster.sh, kafka-libs.sh, postgres.sh and run-tests.sh; never run directly.
#
# Processes are owned through PID files. A PID is only signalled when
# /proc/PID/cmdline still contains a marker (the server's own config path), so a
# recycled PID that now belongs to someone else is never touched.

INFRA_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$INFRA_DIR/../.." && pwd)
# Parent of every state dir (.infra/ is git-ignored).
# shellcheck disable=SC2034 # used by the scripts that source this file
STATE_ROOT=${MANDATED_INFRA_DIR:-$REPO_ROOT/.infra}
SCRIPT_NAME=${SCRIPT_NAME:-$(basename "$0")}

KAFKA_VERSION=${KAFKA_VERSION:-4.4.0}
KAFKA_STORAGE_TOOL_CLASS=${KAFKA_STORAGE_TOOL_CLASS:-kafka.tools.StorageTool}
KAFKA_START_TIMEOUT=${KAFKA_START_TIMEOUT:-180}
KAFKA_STOP_TIMEOUT=${KAFKA_STOP_TIMEOUT:-30}
# The broker's INFO line once it is unfenced and serving requests (KafkaBroker.STARTED_MESSAGE).
KAFKA_STARTED_LINE='Kafka Server started'

log() { printf '%s: %s\n' "$SCRIPT_NAME" "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

is_root() { [ "$(id -u)" = 0 ]; }

# apt_install PKG...: install Debian packages when running as root, else fail with a hint.
apt_install() {
	is_root || die "missing $*; install it (Debian: apt-get install $*) or run as root"
	command -v apt-get >/dev/null || die "missing $* and apt-get is not available"
	log "installing $* with apt-get"
	DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 || die "apt-get update failed"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2 ||
		die "apt-get install $* failed"
}

java_bin() {
	if [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/java" ]; then
		echo "$JAVA_HOME/bin/java"
	elif command -v java >/dev/null; then
		command -v java
	else
		apt_install openjdk-17-jre-headless
		command -v java
	fi
}

# --- processes ---------------------------------------------------------------

# proc_state PID: the one-letter state from /proc (R, S, T, Z, ...), empty if gone.
proc_state() {
	local stat
	stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
	stat=${stat##*) }
	echo "${stat%% *}"
}

# proc_alive PID: running (or stopped), not a zombie.
proc_alive() {
	local s
	[ -n "${1:-}" ] || return 1
	s=$(proc_state "$1")
	[ -n "$s" ] && [ "$s" != Z ] && [ "$s" != X ]
}

# proc_ours PID MARKER: alive and its command line contains MARKER.
proc_ours() {
	proc_alive "$1" || return 1
	tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -F -- "$2" >/dev/null
}

# pidfile_pid PIDFILE MARKER: prints the PID in PIDFILE if that process is ours and alive.
pidfile_pid() {
	local pid
	[ -f "$1" ] || return 0
	pid=$(cat "$1" 2>/dev/null || true)
	if [ -n "$pid" ] && proc_ours "$pid" "$2"; then echo "$pid"; fi
}

# wait_gone PID SECONDS: poll until the process is gone; 1 if still there.
wait_gone() {
	local deadline=$((SECONDS + $2))
	while proc_alive "$1"; do
		[ "$SECONDS" -lt "$deadline" ] || return 1
		sleep 0.1
	done
}

# stop_pid PID SECONDS: SIGTERM (and SIGCONT, in case it is paused), then SIGKILL after SECONDS.
stop_pid() {
	local pid=$1 grace=$2
	proc_alive "$pid" || return 0
	kill -TERM "$pid" 2>/dev/null || true
	kill -CONT "$pid" 2>/dev/null || true
	if ! wait_gone "$pid" "$grace"; then
		log "pid $pid still running ${grace}s after SIGTERM; sending SIGKILL"
		kill -KILL "$pid" 2>/dev/null || true
		wait_gone "$pid" 10 || die "pid $pid survived SIGKILL"
	fi
}

# kill9_pid PID: crash it.
kill9_pid() {
	proc_alive "$1" || return 0
	kill -KILL "$1" 2>/dev/null || true
	wait_gone "$1" 10 || die "pid $1 survived SIGKILL"
}

# port_open PORT: something accepts TCP connections on 127.0.0.1:PORT.
port_open() {
	# shellcheck disable=SC2016 # $1 is for the inner shell
	timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"' _ "$1" 2>/dev/null
}

# reserve_port PORT: a listening port inside the ephemeral range (ip_local_port_range,
# usually 32768-60999, which holds 55432) can be taken as the local port of some
# outgoing connection, e.g. between Kafka nodes, and the server's bind then fails
# with "Address already in use". As root, add PORT to ip_local_reserved_ports so the
# kernel never hands it out, and note it in STATEDIR/reserved-ports so that
# release_ports gives it back when the server's state is deleted; otherwise just say so.
reserve_port() {
	local port=$1 state=${2:-} f=/proc/sys/net/ipv4/ip_local_reserved_ports lo hi cur p
	read -r lo hi 2>/dev/null </proc/sys/net/ipv4/ip_local_port_range || return 0
	[ "$port" -ge "$lo" ] && [ "$port" -le "$hi" ] || return 0
	cur=$(cat "$f" 2>/dev/null || true)
	local IFS=,
	for p in $cur; do
		if [ "${p#*-}" != "$p" ]; then
			[ "$port" -ge "${p%-*}" ] && [ "$port" -le "${p#*-}" ] && return 0
		elif [ "$port" = "$p" ]; then
			return 0
		fi
	done
	if is_root && echo "${cur:+$cur,}$port" 2>/dev/null >"$f"; then
		log "reserved port $port in $f: it is inside the ephemeral range $lo-$hi (given back when the server is deleted)"
		[ -z "$state" ] || echo "$port" >>"$state/reserved-ports"
	else
		log "note: port $port is inside the ephemeral range $lo-$hi; an outgoing connection may take it ($f)"
	fi
}

# release_ports STATEDIR: take the ports reserve_port added for the server whose state is
# STATEDIR out of ip_local_reserved_ports again (a range or a port it did not add stays).
release_ports() {
	local state=$1 f=/proc/sys/net/ipv4/ip_local_reserved_ports p keep=() mine
	[ -f "$state/reserved-ports" ] || return 0
	mine=" $(tr '\n' ' ' <"$state/reserved-ports")"
	local IFS=,
	for p in $(cat "$f" 2>/dev/null); do
		case "$mine " in *" $p "*) ;; *) keep+=("$p") ;; esac
	done
	if echo "${keep[*]}" 2>/dev/null >"$f"; then
		log "gave back the reserved port(s)$mine in $f"
	fi
	rm -f "$state/reserved-ports"
}

# spawn PIDFILE LOGFILE CMD...: start CMD detached (own session, no terminal, output
# to LOGFILE); the PID written is CMD's own, because the wrapper execs it.
spawn() {
	local pidfile=$1 logfile=$2
	shift 2
	rm -f "$pidfile"
	# shellcheck disable=SC2016 # $$ and $@ are for the inner shell
	setsid bash -c 'echo $$ >"$0"; exec "$@"' "$pidfile" "$@" </dev/null >>"$logfile" 2>&1 &
	local deadline=$((SECONDS + 5))
	while [ "$SECONDS" -lt "$deadline" ]; do
		[ -s "$pidfile" ] && return 0
		sleep 0.05
	done
	die "could not start $1 (no pid file after 5s)"
}

# --- Kafka -------------------------------------------------------------------

kafka_libs() { "$INFRA_DIR/kafka-libs.sh"; }

# A KRaft cluster id: 16 random bytes, base64url without padding, not starting with '-'.
kafka_cluster_id() {
	local id
	while :; do
		id=$(head -c16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')
		[ "${id#-}" = "$id" ] && break
	done
	echo "$id"
}

# kafka_test_props: the sizing and timing settings shared by every test broker.
kafka_test_props() {
	cat <<'EOF'
# --- test sizing and timing (shared by every test broker) ---
# The application creates its topics with kadm; nothing appears by accident.
auto.create.topics.enable=false
delete.topic.enable=true
num.partitions=1
offsets.topic.num.partitions=3
transaction.state.log.num.partitions=3
# Consumer groups rebalance at once and tests may use short session timeouts.
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000
group.consumer.min.session.timeout.ms=6000
group.consumer.session.timeout.ms=10000
group.consumer.min.heartbeat.interval.ms=500
group.consumer.heartbeat.interval.ms=1000
# 2-core machines.
num.network.threads=2
num.io.threads=4
background.threads=4
num.recovery.threads.per.data.dir=1
# The cleaner allocates this buffer on the heap at start (default 128 MiB).
log.cleaner.dedupe.buffer.size=16777216
# Failure detection in seconds rather than tens of seconds.
replica.lag.time.max.ms=10000
broker.heartbeat.interval.ms=1000
broker.session.timeout.ms=6000
# message.max.bytes stays at its default (about 1 MiB): tests rely on oversized records being refused.
EOF
}

# kafka_jvm_opts HEAP: the JVM flags for a broker.
kafka_jvm_opts() {
	# shellcheck disable=SC2086 # word splitting of the option strings is intended
	echo ${KAFKA_HEAP_OPTS:-$1} ${KAFKA_JVM_OPTS:--XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true -Djava.net.preferIPv4Stack=true}
}

# kafka_format NODEDIR CLUSTERID [StorageTool flags...]: format NODEDIR/data from NODEDIR/server.properties.
kafka_format() {
	local dir=$1 cid=$2 libs java
	shift 2
	libs=$(kafka_libs)
	java=$(java_bin)
	if ! "$java" -Xmx256m -Dlog4j2.configurationFile="$INFRA_DIR/tools-log4j2.xml" -cp "$libs/*" \
		"$KAFKA_STORAGE_TOOL_CLASS" format --cluster-id "$cid" --config "$dir/server.properties" "$@" \
		>"$dir/format.log" 2>&1; then
		cat "$dir/format.log" >&2
		die "formatting $dir failed"
	fi
	echo "$cid" >"$dir/cluster.id"
}

# kafka_node_pid NODEDIR: the PID of the broker running from NODEDIR, if any.
kafka_node_pid() { pidfile_pid "$1/kafka.pid" "$1/server.properties"; }

# kafka_node_spawn NODEDIR HEAP: start the broker of NODEDIR (already formatted) in the background.
kafka_node_spawn() {
	local dir=$1 heap=$2 libs java
	[ -f "$dir/cluster.id" ] || die "$dir is not formatted (run up first)"
	libs=$(kafka_libs)
	java=$(java_bin)
	[ -f "$dir/server.log" ] && mv -f "$dir/server.log" "$dir/server.log.1"
	mkdir -p "$dir/logs"
	# shellcheck disable=SC2046 # JVM options are meant to split
	spawn "$dir/kafka.pid" "$dir/server.log" "$java" $(kafka_jvm_opts "$heap") \
		-Dlog4j2.configurationFile="$INFRA_DIR/log4j2.xml" -Dkafka.logs.dir="$dir/logs" \
		-cp "$libs/*" kafka.Kafka "$dir/server.properties"
}

# kafka_node_wait NODEDIR PORT...: wait until the broker logged that it started and
# accepts connections on PORT; on failure print the log tail and return 1.
kafka_node_wait() {
	local dir=$1 port=$2 pid deadline=$((SECONDS + KAFKA_START_TIMEOUT))
	pid=$(cat "$dir/kafka.pid")
	while :; do
		if ! proc_alive "$pid"; then
			log "broker in $dir (pid $pid) exited during start; last lines of $dir/server.log:"
			tail -n 40 "$dir/server.log" >&2
			return 1
		fi
		if grep -F "$KAFKA_STARTED_LINE" "$dir/server.log" >/dev/null 2>&1 && port_open "$port"; then
			return 0
		fi
		if [ "$SECONDS" -ge "$deadline" ]; then
			log "broker in $dir (pid $pid) not ready on 127.0.0.1:$port after ${KAFKA_START_TIMEOUT}s (KAFKA_START_TIMEOUT); last lines of $dir/server.log:"
			tail -n 40 "$dir/server.log" >&2
			return 1
		fi
		sleep 0.2
	done
}

# kafka_node_stop NODEDIR: SIGTERM (controlled shutdown), SIGKILL after KAFKA_STOP_TIMEOUT.
kafka_node_stop() {
	local pid
	pid=$(kafka_node_pid "$1")
	[ -n "$pid" ] && stop_pid "$pid" "$KAFKA_STOP_TIMEOUT"
	rm -f "$1/kafka.pid"
}

# kafka_node_kill NODEDIR: kill -9, keep the data.
kafka_node_kill() {
	local pid
	pid=$(kafka_node_pid "$1")
	[ -n "$pid" ] && kill9_pid "$pid"
	rm -f "$1/kafka.pid"
}

# kafka_node_signal NODEDIR SIGNAL: pause (STOP) or resume (CONT) a running broker.
kafka_node_signal() {
	local pid
	pid=$(kafka_node_pid "$1")
	[ -n "$pid" ] || die "no broker running in $1"
	kill "-$2" "$pid"
}

# kafka_node_status NODEDIR: one word: running, paused, stopped or absent.
kafka_node_status() {
	local pid
	pid=$(kafka_node_pid "$1")
	if [ -n "$pid" ]; then
		if [ "$(proc_state "$pid")" = T ]; then echo paused; else echo running; fi
	elif [ -f "$1/cluster.id" ]; then
		echo stopped
	else
		echo absent
	fi
}
