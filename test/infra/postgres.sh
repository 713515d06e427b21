#!/usr/bin/env bash
# postgres.sh: a throwaway PostgreSQL cluster for tests (initdb + pg_ctl).
#
#   postgres.sh up|down|stop-immediate|start|pause|resume|status|url|psql [psql args...]
#   postgres.sh basebackup DIR|restore DIR|promote|detach
#
# pause SIGSTOPs the postmaster and every process it started (backends, checkpointer,
# walwriter...): the server is stopped, not killed, so a client's open connections and
# new ones hang instead of being refused, as with a frozen VM or a network blackhole.
# resume SIGCONTs them all.
#
# Defaults: 127.0.0.1:55432, user postgres, trust auth, state in .infra/pg/ (data/,
# postgres.log, the Unix socket). PG_PORT and PG_DIR override both; another port
# without PG_DIR uses .infra/pg-PORT/. fsync, synchronous_commit and full_page_writes
# stay on: tests see the durability production has.
#
# As root the server runs as the 'postgres' user (initdb refuses root). If that user
# cannot reach the state dir (e.g. a clone under a 0700 temp dir), PG_DIR becomes a
# symlink to /tmp/mandated-pg-<hash>/, removed again by down.
# When initdb is on neither PATH nor /usr/lib/postgresql/*/bin, Debian's postgresql
# package is installed with apt-get (root only).
#
# Backups and replicas (the fault suite's "database that went back in time"): the
# server takes replication connections as initdb sets it up (wal_level replica,
# pg_hba's replication lines, trust on loopback). basebackup DIR writes a base backup
# (pg_basebackup, WAL streamed) to DIR/data; restore DIR crash-stops the server,
# replaces its data with that backup and starts it: a restore from a backup. With
# PG_STANDBY_OF=PORT, up creates the cluster as an asynchronous streaming standby of
# the server on PORT instead of with initdb; promote makes it a primary; detach makes
# it stop receiving WAL (it lags from then on, as a replica whose primary died does).
#
# Environment: PG_PORT, PG_DIR, PG_START_TIMEOUT (s, 60), PG_STANDBY_OF.
set -euo pipefail
# shellcheck source=common.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

PG_PORT=${PG_PORT:-55432}
if [ "$PG_PORT" = 55432 ]; then
	PG_DIR=${PG_DIR:-$STATE_ROOT/pg}
else
	PG_DIR=${PG_DIR:-$STATE_ROOT/pg-$PG_PORT}
fi
PG_START_TIMEOUT=${PG_START_TIMEOUT:-60}
PG_STANDBY_OF=${PG_STANDBY_OF:-}

url() { echo "postgres://postgres@127.0.0.1:$PG_PORT/postgres?sslmode=disable"; }

# bindir: where initdb/pg_ctl/postgres live; installs them if missing.
bindir() {
	local b
	if command -v initdb >/dev/null; then
		b=$(dirname "$(readlink -f "$(command -v initdb)")")
	else
		b=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin 2>/dev/null | sort -V | tail -n 1)
	fi
	if [ -z "$b" ] || [ ! -x "$b/initdb" ]; then
		# Debian's postinst would create and start a 'main' cluster on 5432; we want none.
		if is_root; then
			mkdir -p /etc/postgresql-common
			echo 'create_main_cluster = false' >/etc/postgresql-common/createcluster.conf
		fi
		apt_install postgresql
		b=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin | sort -V | tail -n 1)
		[ -x "$b/initdb" ] || die "installed postgresql but found no initdb"
	fi
	echo "$b"
}

# as_pg CMD...: run CMD as the server's owner.
as_pg() {
	if is_root; then
		# From /, since the postgres user may not be allowed into the current directory.
		(cd / && runuser -u postgres -- "$@")
	else
		"$@"
	fi
}

# real_dir: the physical state dir (PG_DIR or the target of its symlink).
real_dir() { readlink -m "$PG_DIR"; }

server_pid() {
	local d pid
	d=$(real_dir)
	[ -f "$d/data/postmaster.pid" ] || return 0
	pid=$(head -n 1 "$d/data/postmaster.pid" 2>/dev/null || true)
	if [ -n "$pid" ] && proc_ours "$pid" "$d/data"; then echo "$pid"; fi
}

make_dir() {
	mkdir -p "$(dirname "$PG_DIR")"
	if is_root; then
		id postgres >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin postgres
		if [ ! -e "$PG_DIR" ] && ! runuser -u postgres -- test -x "$(dirname "$PG_DIR")"; then
			local target
			target=/tmp/mandated-pg-$(printf '%s' "$PG_DIR" | cksum | cut -d' ' -f1)
			log "user postgres cannot reach $(dirname "$PG_DIR"); keeping the data in $target (symlinked)"
			rm -rf "$target"
			mkdir -p "$target"
			ln -sfn "$target" "$PG_DIR"
		fi
	fi
	mkdir -p "$PG_DIR"
	local d
	d=$(real_dir)
	chmod 700 "$d"
	if is_root; then chown postgres: "$d"; fi
	# Unix socket paths are limited to 107 bytes.
	[ "${#d}" -lt 80 ] || die "state dir path too long for a Unix socket: $d (set PG_DIR)"
}

init() {
	local b d
	b=$(bindir)
	make_dir
	d=$(real_dir)
	as_pg "$b/initdb" -D "$d/data" -A trust -U postgres -E UTF8 --locale=C >"$d/initdb.log" 2>&1 ||
		{
			cat "$d/initdb.log" >&2
			die "initdb failed"
		}
	local preload="#shared_preload_libraries: pg_stat_statements not installed"
	if [ -f "$b/../lib/pg_stat_statements.so" ] ||
		[ -f "$("$b/pg_config" --pkglibdir 2>/dev/null || true)/pg_stat_statements.so" ]; then
		preload="shared_preload_libraries = 'pg_stat_statements'"
	fi
	cat >>"$d/data/postgresql.conf" <<EOF

# --- test/infra/postgres.sh ---
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$d'
max_connections = 200
shared_buffers = 256MB
# Durability as in production: never turn these off for speed.
fsync = on
synchronous_commit = on
full_page_writes = on
$preload
EOF
}

# init_standby: the cluster as a streaming standby of the server on PG_STANDBY_OF.
init_standby() {
	local b d
	b=$(bindir)
	make_dir
	d=$(real_dir)
	as_pg "$b/pg_basebackup" -h 127.0.0.1 -p "$PG_STANDBY_OF" -U postgres -D "$d/data" -X stream -c fast -R >"$d/initdb.log" 2>&1 ||
		{
			cat "$d/initdb.log" >&2
			die "pg_basebackup from 127.0.0.1:$PG_STANDBY_OF failed"
		}
	# The copied postgresql.conf is the primary's: this server's own port and
	# socket directory win (later settings override earlier ones).
	cat >>"$d/data/postgresql.conf" <<EOF

# --- test/infra/postgres.sh: standby of 127.0.0.1:$PG_STANDBY_OF ---
port = $PG_PORT
unix_socket_directories = '$d'
EOF
}

# basebackup DIR: a base backup of this server in DIR/data.
basebackup() {
	local b
	[ -n "${1:-}" ] || die "usage: basebackup DIR"
	[ -n "$(server_pid)" ] || die "not running"
	b=$(bindir)
	mkdir -p "$1"
	if is_root; then chown postgres: "$1"; fi
	chmod 700 "$1"
	as_pg "$b/pg_basebackup" -h 127.0.0.1 -p "$PG_PORT" -U postgres -D "$1/data" -X stream -c fast ||
		die "pg_basebackup of 127.0.0.1:$PG_PORT failed"
	log "base backup of 127.0.0.1:$PG_PORT in $1/data"
}

# restore DIR: crash-stop, replace the data with the base backup in DIR/data, start.
restore() {
	local d
	[ -n "${1:-}" ] && [ -e "$1/data/PG_VERSION" ] || die "usage: restore DIR (a base backup in DIR/data)"
	stop immediate
	d=$(real_dir)
	rm -rf "$d/data"
	mv "$1/data" "$d/data"
	start
	log "restored the base backup of $1"
}

start() {
	local b d pid
	b=$(bindir)
	[ -e "$PG_DIR/data/PG_VERSION" ] || die "$PG_DIR holds no cluster; use up"
	d=$(real_dir)
	pid=$(server_pid)
	[ -z "$pid" ] || die "already running (pid $pid)"
	port_open "$PG_PORT" && die "127.0.0.1:$PG_PORT is in use by a process this script did not start"
	reserve_port "$PG_PORT" "$d"
	local t0=$SECONDS
	if ! as_pg "$b/pg_ctl" -D "$d/data" -l "$d/postgres.log" -w -t "$PG_START_TIMEOUT" start >/dev/null; then
		log "PostgreSQL did not start within ${PG_START_TIMEOUT}s; last lines of $d/postgres.log:"
		tail -n 30 "$d/postgres.log" >&2
		if grep -F 'Address already in use' "$d/postgres.log" >/dev/null; then
			log "sockets on port $PG_PORT:"
			ss -tanp 2>/dev/null | grep -F ":$PG_PORT " >&2 || true
		fi
		die "PostgreSQL did not start"
	fi
	if grep -F pg_stat_statements "$d/data/postgresql.conf" | grep -v '^#' >/dev/null; then
		psql_cmd -q -c 'CREATE EXTENSION IF NOT EXISTS pg_stat_statements' >/dev/null 2>&1 ||
			log "warning: could not create extension pg_stat_statements"
	fi
	log "PostgreSQL ready at $(url) in $((SECONDS - t0))s (pid $(server_pid), dir $PG_DIR)"
}

psql_bin() {
	if command -v psql >/dev/null; then command -v psql; else echo "$(bindir)/psql"; fi
}

psql_cmd() { "$(psql_bin)" -X -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres "$@"; }

# stop MODE: pg_ctl stop (fast or immediate); SIGKILL our postmaster if pg_ctl fails.
stop() {
	local pid d
	pid=$(server_pid)
	[ -n "$pid" ] || return 0
	d=$(real_dir)
	local p
	kill -CONT "$pid" 2>/dev/null || true
	for p in $(PARENT=$pid children); do kill -CONT "$p" 2>/dev/null || true; done
	if ! as_pg "$(bindir)/pg_ctl" -D "$d/data" -m "$1" -w -t 30 stop >/dev/null; then
		log "pg_ctl stop -m $1 failed; sending SIGKILL to pid $pid"
		kill9_pid "$pid"
	fi
}

# children PID: the processes PID started (parsed from /proc/*/stat with builtins only:
# a pause must be quick, or backends forked meanwhile would escape it).
children() {
	local f line rest
	for f in /proc/[0-9]*/stat; do
		read -r line 2>/dev/null <"$f" || continue
		rest=${line##*) }
		# shellcheck disable=SC2086 # the fields after the command name: state, ppid, ...
		set -- $rest
		[ "${2:-}" = "$PARENT" ] || continue
		f=${f#/proc/}
		echo "${f%/stat}"
	done
	return 0
}

# signal_tree SIG: the postmaster first (so it starts no new backend), then its
# children; with STOP, again until every child is stopped (one being forked as
# the postmaster stopped shows up on the next pass).
signal_tree() {
	local pid p pass left
	pid=$(server_pid)
	[ -n "$pid" ] || die "not running"
	kill -"$1" "$pid" 2>/dev/null || true
	for pass in 1 2 3 4 5; do
		left=0
		for p in $(PARENT=$pid children); do
			if [ "$1" = STOP ] && [ "$(proc_state "$p")" = T ]; then continue; fi
			kill -"$1" "$p" 2>/dev/null || true
			left=1
		done
		[ "$1" = STOP ] && [ "$left" = 1 ] || break
	done
	return 0
}

status_word() {
	local pid
	pid=$(server_pid)
	if [ -n "$pid" ]; then
		echo "running pid=$pid url=$(url) dir=$PG_DIR"
	elif [ -e "$PG_DIR/data/PG_VERSION" ]; then
		echo "stopped dir=$PG_DIR"
	else
		echo "absent dir=$PG_DIR"
	fi
}

cmd=${1:-}
case "$cmd" in
up)
	if [ -n "$(server_pid)" ]; then
		log "already running at $(url) (pid $(server_pid))"
	else
		if [ ! -e "$PG_DIR/data/PG_VERSION" ]; then
			if [ -n "$PG_STANDBY_OF" ]; then init_standby; else init; fi
		fi
		start
	fi
	;;
basebackup) basebackup "${2:-}" ;;
restore) restore "${2:-}" ;;
promote)
	as_pg "$(bindir)/pg_ctl" -D "$(real_dir)/data" -w -t "$PG_START_TIMEOUT" promote >/dev/null
	log "promoted: a primary now"
	;;
detach)
	psql_cmd -q -c "ALTER SYSTEM SET primary_conninfo = ''" -c 'SELECT pg_reload_conf()' >/dev/null
	log "stopped receiving WAL from its primary"
	;;
start) start ;;
down)
	if [ -e "$PG_DIR" ]; then
		stop fast
		d=$(real_dir)
		release_ports "$d"
		rm -rf "$d"
		[ ! -L "$PG_DIR" ] || rm -f "$PG_DIR"
	fi
	log "stopped; removed $PG_DIR"
	;;
stop-immediate)
	stop immediate
	log "stopped (immediate, crash-like); data kept in $PG_DIR"
	;;
pause)
	signal_tree STOP
	log "paused (SIGSTOP): connections hang until resume"
	;;
resume)
	signal_tree CONT
	log "resumed (SIGCONT)"
	;;
status)
	s=$(status_word)
	echo "$s"
	[ "${s%% *}" = running ]
	;;
url) url ;;
psql)
	shift
	psql_cmd "$@"
	;;
*)
	echo "usage: $(basename "$0") up|down|stop-immediate|start|pause|resume|status|url|psql [args]|basebackup DIR|restore DIR|promote|detach" >&2
	exit 2
	;;
esac
