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
#   scripts/cluster.sh rabbit up       start a fresh 3-node RabbitMQ cluster
#   scripts/cluster.sh rabbit down     stop it and delete its data
#   scripts/cluster.sh rabbit kill N   kill -9 node N (1-3)
#   scripts/cluster.sh rabbit start N  start node N again; it rejoins the cluster
#   scripts/cluster.sh rabbit env      print its node URLs and names
#
# The shard is a mariadbd of its own, run directly (no mysqld_safe, so a
# kill -9 keeps it down until the test brings it back), with Debian's
# binaries and no Debian config: datadir, socket, pid file and log under
# .services/mariadb-shard2 (git-ignored), loopback port
# DELAYBRIDGE_SHARD2_PORT (default 3307). It is small (64 MB buffer pool)
# and keeps its data between runs, so only the first start initialises it.
#
# The RabbitMQ cluster is three nodes of Debian's RabbitMQ on this machine,
# run as the rabbitmq user and so sharing its Erlang cookie (one cookie for
# the three): node N is dbclusterN@<host>, AMQP on 127.0.0.1:568(1+N)
# (5682-5684), distribution on 2568(1+N), each with its own mnesia, log and
# pid file under .services/rabbit-cluster/nN, no plugins, one Erlang
# scheduler each (the box has two cores). `up` always starts a fresh
# cluster (node 2 and 3 join node 1) with the delaybridge user; `down`
# deletes it all.
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

# ---------------------------------------------------------------- RabbitMQ cluster

RABBIT_DIR="$ROOT/.services/rabbit-cluster"
RABBIT_HOST="$(hostname -s)"
RABBIT_NODES=(1 2 3)

rabbit_name() { echo "dbcluster$1@$RABBIT_HOST"; }
rabbit_port() { echo $((5681 + $1)); }
rabbitctl() {
	local n="$1"
	shift
	rabbitmqctl -q -n "$(rabbit_name "$n")" "$@"
}

rabbit_start() {
	local n="$1" dir="$RABBIT_DIR/n$1"
	[[ -d "$dir" ]] || die "node $n has no data directory: run \`$0 rabbit up\` first"
	if port_open "$(rabbit_port "$n")"; then
		log "RabbitMQ node $(rabbit_name "$n") already running"
		return 0
	fi
	runuser -u rabbitmq -- env HOME=/var/lib/rabbitmq \
		RABBITMQ_NODENAME="$(rabbit_name "$n")" RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
		RABBITMQ_NODE_PORT="$(rabbit_port "$n")" RABBITMQ_DIST_PORT=$((25681 + n)) \
		RABBITMQ_MNESIA_BASE="$dir/mnesia" RABBITMQ_LOG_BASE="$dir/log" RABBITMQ_PID_FILE="$dir/pid" \
		RABBITMQ_CONFIG_FILE="$RABBIT_DIR/rabbitmq.conf" RABBITMQ_ADVANCED_CONFIG_FILE="$RABBIT_DIR/advanced.config" \
		RABBITMQ_ENABLED_PLUGINS_FILE="$RABBIT_DIR/enabled_plugins" \
		RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="+S 1:1 +sbwt none" \
		setsid /usr/lib/rabbitmq/bin/rabbitmq-server </dev/null >"$dir/startup.log" 2>&1 &
	if ! wait_for "$START_TIMEOUT" port_open "$(rabbit_port "$n")" || ! rabbitctl "$n" await_startup --timeout 60 >/dev/null; then
		tail -n 40 "$dir/startup.log" "$dir"/log/*.log >&2 || true
		die "RabbitMQ node $(rabbit_name "$n") did not start within ${START_TIMEOUT}s (logs above)"
	fi
	log "RabbitMQ node $(rabbit_name "$n") up on 127.0.0.1:$(rabbit_port "$n")"
}

rabbit_up() {
	local n running=0
	for n in "${RABBIT_NODES[@]}"; do
		port_open "$(rabbit_port "$n")" && running=$((running + 1))
	done
	if ((running == ${#RABBIT_NODES[@]})) && [[ "$(rabbitctl 1 eval 'length(rabbit_nodes:all_running()).')" == 3 ]]; then
		log "RabbitMQ cluster already running with 3 nodes, reusing"
		return 0
	fi
	rabbit_down
	mkdir -p "$RABBIT_DIR"
	cat >"$RABBIT_DIR/rabbitmq.conf" <<-'CONF'
		# The 3-node test cluster of scripts/cluster.sh: listeners come from
		# RABBITMQ_NODE_IP_ADDRESS and RABBITMQ_NODE_PORT.
		loopback_users.guest = true
		disk_free_limit.absolute = 200MB
		# The three find each other at their first boot and form one cluster.
		cluster_formation.peer_discovery_backend = classic_config
		cluster_formation.classic_config.nodes.1 = dbcluster1@@HOST@
		cluster_formation.classic_config.nodes.2 = dbcluster2@@HOST@
		cluster_formation.classic_config.nodes.3 = dbcluster3@@HOST@
		cluster_formation.randomized_startup_delay_range.min = 0
		cluster_formation.randomized_startup_delay_range.max = 2
		# The user the tests log in as, made at the cluster's first boot.
		default_user = delaybridge
		default_pass = delaybridge
		default_user_tags.administrator = true
		default_permissions.configure = .*
		default_permissions.read = .*
		default_permissions.write = .*
	CONF
	sed -i "s/@HOST@/$RABBIT_HOST/" "$RABBIT_DIR/rabbitmq.conf"
	cp "$ROOT/scripts/rabbitmq/advanced.config" "$RABBIT_DIR/advanced.config"
	echo '[].' >"$RABBIT_DIR/enabled_plugins"
	for n in "${RABBIT_NODES[@]}"; do
		mkdir -p "$RABBIT_DIR/n$n/log"
	done
	chown -R rabbitmq:rabbitmq "$RABBIT_DIR"
	local pids=()
	for n in "${RABBIT_NODES[@]}"; do
		rabbit_start "$n" &
		pids+=($!)
	done
	for n in "${pids[@]}"; do
		wait "$n" || die "a RabbitMQ cluster node did not start"
	done
	if ! wait_for 60 bash -c "[[ \"\$(rabbitmqctl -q -n $(rabbit_name 1) eval 'length(rabbit_nodes:all_running()).')\" == 3 ]]"; then
		die "the three RabbitMQ nodes did not form one cluster: $(rabbitctl 1 cluster_status 2>&1 | tr '\n' ' ')"
	fi
	log "RabbitMQ cluster up: $(rabbit_name 1) $(rabbit_name 2) $(rabbit_name 3)"
}

rabbit_kill() {
	local n="$1" pid
	[[ -f "$RABBIT_DIR/n$n/pid" ]] || die "node $n has no pid file"
	pid=$(cat "$RABBIT_DIR/n$n/pid")
	grep -q beam "/proc/$pid/cmdline" 2>/dev/null || die "pid $pid of node $n is not a running Erlang VM"
	log "kill -9 RabbitMQ node $(rabbit_name "$n") (pid $pid)"
	kill -9 "$pid"
	wait_for 60 bash -c "! kill -0 $pid 2>/dev/null" || die "pid $pid still alive after SIGKILL"
}

rabbit_down() {
	local n pids=()
	for n in "${RABBIT_NODES[@]}"; do
		if port_open "$(rabbit_port "$n")" || rabbitctl "$n" status >/dev/null 2>&1; then
			log "stopping RabbitMQ node $(rabbit_name "$n")"
			rabbitctl "$n" stop >/dev/null 2>&1 &
			pids+=($!)
		fi
	done
	for n in "${pids[@]}"; do
		wait "$n" || true
	done
	for n in "${RABBIT_NODES[@]}"; do
		if [[ -f "$RABBIT_DIR/n$n/pid" ]] && pid_alive "$RABBIT_DIR/n$n/pid"; then
			kill -9 "$(cat "$RABBIT_DIR/n$n/pid")" 2>/dev/null || true
		fi
	done
	rm -rf "$RABBIT_DIR"
}

rabbit_env() {
	local n urls=()
	for n in "${RABBIT_NODES[@]}"; do
		urls+=("amqp://delaybridge:delaybridge@127.0.0.1:$(rabbit_port "$n")/")
	done
	printf "DELAYBRIDGE_CLUSTER_AMQP_URLS='%s'\n" "$(
		IFS=,
		echo "${urls[*]}"
	)"
	printf "DELAYBRIDGE_CLUSTER_NODES='%s'\n" "$(rabbit_name 1),$(rabbit_name 2),$(rabbit_name 3)"
}

rabbit_node_arg() {
	[[ "${1:-}" =~ ^[123]$ ]] || usage
}

usage() {
	echo "usage: $0 shard up|down|kill|env | rabbit up|down|kill N|start N|env" >&2
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
rabbit)
	case "${2:-}" in
	up) rabbit_up ;;
	down) rabbit_down ;;
	kill) rabbit_node_arg "${3:-}" && rabbit_kill "$3" ;;
	start) rabbit_node_arg "${3:-}" && rabbit_start "$3" ;;
	env) rabbit_env ;;
	*) usage ;;
	esac
	;;
*) usage ;;
esac
