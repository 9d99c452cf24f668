#!/usr/bin/env bash
# Extra local servers for the tests of deployed shapes (docs/deployment.md):
# servers that only the tests needing them start, and stop when they finish.
# The shared services of scripts/services.sh (3306, 5672, 9876/10911) are
# never touched.
#
#   scripts/cluster.sh shard up     start a second MariaDB server (an outbox shard)
#   scripts/cluster.sh shard down   stop it cleanly
#   scripts/cluster.sh shard kill   kill -9 it (nothing restarts it; `shard up` does)
#   scripts/cluster.sh shard env    print its DSN as DELAYBRIDGE_SHARD2_DSN
#
# The shard is a mariadbd of its own, run directly (no mysqld_safe, so a
# kill -9 keeps it down until the test brings it back), with Debian's
# binaries and no Debian config: datadir, socket, pid file and log under
# .services/mariadb-shard2 (git-ignored), loopback port
# DELAYBRIDGE_SHARD2_PORT (default 3307). It is small (64 MB buffer pool)
# and keeps its data between runs, so only the first start initialises it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
START_TIMEOUT="${DELAYBRIDGE_START_TIMEOUT:-120}"

SHARD_PORT="${DELAYBRIDGE_SHARD2_PORT:-3307}"
SHARD_DIR="$ROOT/.services/mariadb-shard2"
SHARD_DATA="$SHARD_DIR/data"
SHARD_SOCK="$SHARD_DIR/mysqld.sock"
SHARD_PID="$SHARD_DIR/mysqld.pid"
SHARD_LOG="$SHARD_DIR/error.log"
SHARD_DSN="delaybridge:delaybridge@tcp(127.0.0.1:$SHARD_PORT)/delaybridge?parseTime=true&multiStatements=true"

log() { printf '%s cluster: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
	log "ERROR: $*"
	exit 1
}
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
pid_alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

# wait_for TIMEOUT CHECK... : run CHECK every 200 ms until it succeeds.
wait_for() {
	local deadline=$((SECONDS + $1))
	shift
	until "$@"; do
		((SECONDS < deadline)) || return 1
		sleep 0.2
	done
}

shard_sql() { mariadb --no-defaults -uroot -S "$SHARD_SOCK" "$@"; }
shard_ping() { mariadb-admin --no-defaults -uroot -S "$SHARD_SOCK" --silent ping >/dev/null 2>&1; }

shard_up() {
	if pid_alive "$SHARD_PID" && port_open "$SHARD_PORT"; then
		log "MariaDB shard already running on 127.0.0.1:$SHARD_PORT, reusing"
		return 0
	fi
	if port_open "$SHARD_PORT"; then
		die "port $SHARD_PORT is taken by a process that is not this checkout's shard (set DELAYBRIDGE_SHARD2_PORT)"
	fi
	mkdir -p "$SHARD_DIR"
	chown mysql:mysql "$SHARD_DIR"
	if [[ ! -d "$SHARD_DATA/mysql" ]]; then
		log "initialising the MariaDB shard's data directory $SHARD_DATA"
		mariadb-install-db --no-defaults --user=mysql --datadir="$SHARD_DATA" --skip-test-db >"$SHARD_DIR/install.log" 2>&1 ||
			{
				tail -n 30 "$SHARD_DIR/install.log" >&2
				die "mariadb-install-db failed"
			}
	fi
	log "starting the MariaDB shard on 127.0.0.1:$SHARD_PORT"
	nohup setsid mariadbd --no-defaults --user=mysql --datadir="$SHARD_DATA" --socket="$SHARD_SOCK" \
		--pid-file="$SHARD_PID" --log-error="$SHARD_LOG" --port="$SHARD_PORT" --bind-address=127.0.0.1 \
		--character-set-server=utf8mb4 --collation-server=utf8mb4_general_ci --default-time-zone=+00:00 \
		--skip-name-resolve --max-connections=300 --innodb-buffer-pool-size=64M --innodb-log-file-size=48M \
		</dev/null >/dev/null 2>&1 &
	if ! wait_for "$START_TIMEOUT" port_open "$SHARD_PORT" || ! wait_for 30 shard_ping; then
		tail -n 50 "$SHARD_LOG" >&2 || true
		die "the MariaDB shard did not start within ${START_TIMEOUT}s (log above)"
	fi
	shard_sql <<-'SQL'
		CREATE DATABASE IF NOT EXISTS delaybridge CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci;
		CREATE USER IF NOT EXISTS 'delaybridge'@'127.0.0.1' IDENTIFIED BY 'delaybridge';
		GRANT ALL PRIVILEGES ON `delaybridge`.* TO 'delaybridge'@'127.0.0.1';
		GRANT ALL PRIVILEGES ON `delaybridge\_%`.* TO 'delaybridge'@'127.0.0.1';
		FLUSH PRIVILEGES;
	SQL
	log "MariaDB shard $(shard_sql -N -e 'SELECT VERSION()') up on 127.0.0.1:$SHARD_PORT"
}

shard_down() {
	if pid_alive "$SHARD_PID"; then
		local pid
		pid=$(cat "$SHARD_PID")
		log "stopping the MariaDB shard (pid $pid)"
		mariadb-admin --no-defaults -uroot -S "$SHARD_SOCK" shutdown >/dev/null 2>&1 || kill "$pid" 2>/dev/null || true
		wait_for 60 bash -c "! kill -0 $pid 2>/dev/null" || {
			log "the MariaDB shard did not stop in 60s, killing it"
			kill -9 "$pid" 2>/dev/null || true
		}
	fi
}

shard_kill() {
	pid_alive "$SHARD_PID" || die "the MariaDB shard is not running (no live $SHARD_PID)"
	local pid
	pid=$(cat "$SHARD_PID")
	grep -q mariadbd "/proc/$pid/cmdline" || die "pid $pid in $SHARD_PID is not mariadbd"
	log "kill -9 the MariaDB shard (pid $pid)"
	kill -9 "$pid"
	wait_for 60 bash -c "! kill -0 $pid 2>/dev/null" || die "pid $pid still alive after SIGKILL"
	# A killed server leaves its pid file; the next start replaces it.
}

shard_env() {
	printf "DELAYBRIDGE_SHARD2_DSN='%s'\n" "$SHARD_DSN"
}

usage() {
	echo "usage: $0 shard up|down|kill|env" >&2
	exit 2
}

case "${1:-}" in
shard)
	case "${2:-}" in
	up) shard_up ;;
	down) shard_down ;;
	kill) shard_kill ;;
	env) shard_env ;;
	*) usage ;;
	esac
	;;
*) usage ;;
esac
