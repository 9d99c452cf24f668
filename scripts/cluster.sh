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
#   scripts/cluster.sh rocket up       start a name server and two RocketMQ broker groups
#   scripts/cluster.sh rocket down     stop them and delete their data
#   scripts/cluster.sh rocket status   print each of the three up/down
#   scripts/cluster.sh rocket kill B   kill -9 broker B (a or b); nothing restarts it
#   scripts/cluster.sh rocket start B  start broker B again on its store; it re-registers
#   scripts/cluster.sh rocket env      print the name server and broker addresses
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
#
# The RocketMQ profile is RocketMQ 5 from the jars scripts/services.sh fetches
# into .services/rocketmq/lib (fetched the same way when missing): a name
# server of its own on 127.0.0.1:9886 and two broker groups under it in
# cluster DelaybridgeCluster, broker-a on 10921 and broker-b on 10931 (each also listens on its port - 2 and + 1), one master
# each, configured like the shared broker (timer wheel on, 1 h max delay,
# 100 ms precision, topics auto-created). Small heaps (128 MB name server,
# 256 MB per broker); stores and logs under .services/rocket-cluster/<node>.
# `up` reuses a running profile, else starts a fresh one; `down` deletes it.
# The shared name server (9876) and broker (10911) are never touched.
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

# ---------------------------------------------------------------- RocketMQ brokers

RMQ_CLUSTER_DIR="$ROOT/.services/rocket-cluster"
RMQ_CLUSTER_LIB="$ROOT/.services/rocketmq/lib"
RMQ_CLUSTER_NAMESRV_PORT=9886
RMQ_CLUSTER_NAME=DelaybridgeCluster
RMQ_BROKERS=(a b)

rocket_port() {
	case "$1" in
	a) echo 10921 ;;
	b) echo 10931 ;;
	esac
}

# rocket_jars: the jars services.sh fetches, fetched the same way if missing.
rocket_jars() {
	if [[ -d "$RMQ_CLUSTER_LIB" ]] && [[ -n "$(ls -A "$RMQ_CLUSTER_LIB" 2>/dev/null)" ]]; then
		return 0
	fi
	command -v mvn >/dev/null 2>&1 || die "no RocketMQ jars in $RMQ_CLUSTER_LIB and no mvn to fetch them (run scripts/services.sh up)"
	log "fetching RocketMQ jars from Maven Central into $RMQ_CLUSTER_LIB"
	mkdir -p "$RMQ_CLUSTER_LIB"
	mvn -q -B -Dstyle.color=never -f "$ROOT/scripts/rocketmq/pom.xml" dependency:copy-dependencies \
		-DoutputDirectory="$RMQ_CLUSTER_LIB" || die "mvn could not fetch the RocketMQ jars"
}

# rocket_java DIR HEAP MAINCLASS ARGS... : start a JVM in its own session with
# DIR as its home (its logs go to DIR/logs/rocketmqlogs), its pid in DIR/pid.
rocket_java() {
	local dir="$1" heap="$2" logback
	shift 2
	case "$1" in
	*NamesrvStartup) logback=rmq.namesrv.logback.xml ;;
	*) logback=rmq.broker.logback.xml ;;
	esac
	(
		echo "$BASHPID" >"$dir/pid"
		export ROCKETMQ_HOME="$dir"
		# shellcheck disable=SC2086
		exec setsid java -server $heap -XX:+UseG1GC -XX:MaxDirectMemorySize=256m \
			-XX:-OmitStackTraceInFastThrow -Djava.net.preferIPv4Stack=true \
			--add-opens java.base/java.nio=ALL-UNNAMED \
			--add-opens java.base/sun.nio.ch=ALL-UNNAMED \
			--add-opens java.base/java.lang=ALL-UNNAMED \
			-Duser.home="$dir" -Drocketmq.home.dir="$dir" \
			-Drmq.logback.configurationFile="$logback" \
			-Dtls.server.mode=disabled -Djava.security.egd=file:/dev/./urandom \
			-cp "$RMQ_CLUSTER_LIB/*" "$@"
	) </dev/null >"$dir/out.log" 2>&1 &
}

rocket_mqadmin() {
	DELAYBRIDGE_ROCKETMQ_NAMESRV="127.0.0.1:$RMQ_CLUSTER_NAMESRV_PORT" "$ROOT/scripts/mqadmin.sh" "$@"
}

# rocket_registered: both brokers are in the name server's cluster list.
rocket_registered() {
	local out
	out=$(rocket_mqadmin clusterList 2>/dev/null) || return 1
	grep -q "127.0.0.1:$(rocket_port a)" <<<"$out" && grep -q "127.0.0.1:$(rocket_port b)" <<<"$out"
}

rocket_broker_conf() {
	local b="$1" dir="$RMQ_CLUSTER_DIR/broker-$1" port
	port=$(rocket_port "$b")
	# The shared broker's config, for this broker group and name server.
	sed -e "s|@ROCKETMQ_DIR@|$dir|g" \
		-e "s|^brokerClusterName=.*|brokerClusterName=$RMQ_CLUSTER_NAME|" \
		-e "s|^brokerName=.*|brokerName=broker-$b|" \
		-e "s|^namesrvAddr=.*|namesrvAddr=127.0.0.1:$RMQ_CLUSTER_NAMESRV_PORT|" \
		-e "s|^listenPort=.*|listenPort=$port\nhaListenPort=$((port + 1))|" \
		-e "s|^mappedFileSizeCommitLog=.*|mappedFileSizeCommitLog=67108864|" \
		"$ROOT/scripts/rocketmq/broker.conf" >"$dir/broker.conf"
	grep -q "^brokerName=broker-$b$" "$dir/broker.conf" && grep -q "^listenPort=$port$" "$dir/broker.conf" ||
		die "could not render $dir/broker.conf from scripts/rocketmq/broker.conf"
}

rocket_start() {
	local b="$1" dir="$RMQ_CLUSTER_DIR/broker-$1"
	[[ -f "$dir/broker.conf" ]] || die "broker-$b has no config: run \`$0 rocket up\` first"
	if port_open "$(rocket_port "$b")"; then
		log "RocketMQ broker-$b already running"
	else
		rocket_java "$dir" "-Xms256m -Xmx256m" org.apache.rocketmq.broker.BrokerStartup -c "$dir/broker.conf"
		if ! wait_for "$START_TIMEOUT" port_open "$(rocket_port "$b")"; then
			tail -n 40 "$dir/out.log" "$dir/logs/rocketmqlogs/broker.log" >&2 || true
			die "RocketMQ broker-$b did not start within ${START_TIMEOUT}s (logs above)"
		fi
	fi
	local deadline=$((SECONDS + START_TIMEOUT))
	until rocket_mqadmin clusterList 2>/dev/null | grep -q "127.0.0.1:$(rocket_port "$b")"; do
		((SECONDS < deadline)) || die "RocketMQ broker-$b did not register with the name server in ${START_TIMEOUT}s"
		sleep 1
	done
	log "RocketMQ broker-$b up on 127.0.0.1:$(rocket_port "$b")"
}

rocket_up() {
	if port_open "$RMQ_CLUSTER_NAMESRV_PORT" && port_open "$(rocket_port a)" && port_open "$(rocket_port b)" && rocket_registered; then
		log "RocketMQ name server and brokers a, b already running, reusing"
		return 0
	fi
	rocket_down
	local p
	for p in "$RMQ_CLUSTER_NAMESRV_PORT" $(rocket_port a) $(rocket_port b); do
		for p in $((p - 2)) "$p" $((p + 1)); do
			! port_open "$p" || die "port $p is taken by a process that is not this profile's"
		done
	done
	rocket_jars
	mkdir -p "$RMQ_CLUSTER_DIR/namesrv" "$RMQ_CLUSTER_DIR/broker-a" "$RMQ_CLUSTER_DIR/broker-b"
	echo "listenPort=$RMQ_CLUSTER_NAMESRV_PORT" >"$RMQ_CLUSTER_DIR/namesrv/namesrv.conf"
	rocket_java "$RMQ_CLUSTER_DIR/namesrv" "-Xms128m -Xmx128m" org.apache.rocketmq.namesrv.NamesrvStartup \
		-c "$RMQ_CLUSTER_DIR/namesrv/namesrv.conf"
	if ! wait_for "$START_TIMEOUT" port_open "$RMQ_CLUSTER_NAMESRV_PORT"; then
		tail -n 40 "$RMQ_CLUSTER_DIR/namesrv/out.log" >&2 || true
		die "the RocketMQ name server did not start within ${START_TIMEOUT}s (log above)"
	fi
	log "RocketMQ name server up on 127.0.0.1:$RMQ_CLUSTER_NAMESRV_PORT"
	local b pids=()
	for b in "${RMQ_BROKERS[@]}"; do
		rocket_broker_conf "$b"
		rocket_start "$b" &
		pids+=($!)
	done
	for b in "${pids[@]}"; do
		wait "$b" || die "a RocketMQ broker did not start"
	done
	log "RocketMQ cluster $RMQ_CLUSTER_NAME up: name server 127.0.0.1:$RMQ_CLUSTER_NAMESRV_PORT, broker-a 127.0.0.1:$(rocket_port a), broker-b 127.0.0.1:$(rocket_port b)"
}

# rocket_pid NODE: the live pid of this profile's NODE (namesrv, broker-a,
# broker-b), checked to be a RocketMQ JVM, or nothing.
rocket_pid() {
	local f="$RMQ_CLUSTER_DIR/$1/pid" pid
	pid_alive "$f" || return 0
	pid=$(cat "$f")
	grep -q org.apache.rocketmq "/proc/$pid/cmdline" 2>/dev/null && echo "$pid"
	return 0
}

rocket_kill() {
	local b="$1" pid
	pid=$(rocket_pid "broker-$b")
	[[ -n "$pid" ]] || die "RocketMQ broker-$b is not running (no live $RMQ_CLUSTER_DIR/broker-$b/pid)"
	log "kill -9 RocketMQ broker-$b (pid $pid)"
	kill -9 "$pid"
	wait_for 60 bash -c "! kill -0 $pid 2>/dev/null" || die "pid $pid still alive after SIGKILL"
}

# rocket_down kills the three with SIGKILL: their data is deleted next, so
# a clean shutdown (16 s here) would buy nothing.
rocket_down() {
	local node pid pids=()
	for node in broker-a broker-b namesrv; do
		pid=$(rocket_pid "$node")
		if [[ -n "$pid" ]]; then
			log "stopping RocketMQ $node (pid $pid)"
			kill -9 "$pid" 2>/dev/null || true
			pids+=("$pid")
		fi
	done
	for pid in "${pids[@]}"; do
		wait_for 30 bash -c "! kill -0 $pid 2>/dev/null" || die "pid $pid still alive after SIGKILL"
	done
	rm -rf "$RMQ_CLUSTER_DIR"
}

rocket_status() {
	local entry name port
	for entry in "namesrv $RMQ_CLUSTER_NAMESRV_PORT" "broker-a $(rocket_port a)" "broker-b $(rocket_port b)"; do
		read -r name port <<<"$entry"
		if port_open "$port"; then
			printf 'rocket-%-9s up   (127.0.0.1:%s)\n' "$name" "$port"
		else
			printf 'rocket-%-9s down\n' "$name"
		fi
	done
}

rocket_env() {
	printf "DELAYBRIDGE_CLUSTER_ROCKETMQ_NAMESRV='127.0.0.1:%s'\n" "$RMQ_CLUSTER_NAMESRV_PORT"
	printf "DELAYBRIDGE_CLUSTER_ROCKETMQ_BROKERS='broker-a=127.0.0.1:%s,broker-b=127.0.0.1:%s'\n" "$(rocket_port a)" "$(rocket_port b)"
	printf "DELAYBRIDGE_CLUSTER_ROCKETMQ_CLUSTER='%s'\n" "$RMQ_CLUSTER_NAME"
}

rocket_broker_arg() {
	[[ "${1:-}" =~ ^[ab]$ ]] || usage
}

usage() {
	echo "usage: $0 shard up|down|kill|env | rabbit up|down|kill N|start N|env | rocket up|down|status|kill B|start B|env" >&2
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
rocket)
	case "${2:-}" in
	up) rocket_up ;;
	down) rocket_down ;;
	status) rocket_status ;;
	kill) rocket_broker_arg "${3:-}" && rocket_kill "$3" ;;
	start) rocket_broker_arg "${3:-}" && rocket_start "$3" ;;
	env) rocket_env ;;
	*) usage ;;
	esac
	;;
*) usage ;;
esac
