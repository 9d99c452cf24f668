#!/usr/bin/env bash
# Local services for delaybridge's tests: MariaDB, RabbitMQ, RocketMQ 5 and an
# OpenTelemetry Collector (built from scripts/otelcol with Go).
#
#   scripts/services.sh up      install what is missing, start what is stopped, set up users
#   scripts/services.sh down    stop them all (or only those named: down rocketmq)
#   scripts/services.sh status  print each service up/down
#   scripts/services.sh env     print the settings the tests and CLI read, as export lines for eval
#
# TLS: `up` also makes a throwaway local CA, a server certificate for
# 127.0.0.1/localhost and a client certificate under .services/tls (git-ignored),
# installs copies readable only by the mysql and rabbitmq users, and turns on TLS
# in MariaDB (optional per connection: plain clients still work) and a RabbitMQ
# AMQPS listener on 127.0.0.1:5671. `env` prints their paths as
# DELAYBRIDGE_TEST_TLS_* for the TLS tests.
#
# Runs as root on Debian 12 without systemd: services are started directly, never
# through invoke-rc.d. A service already listening on its port is reused.
# MariaDB and RabbitMQ use Debian's packages and locations (/var/lib/mysql,
# /var/log/mysql, /var/lib/rabbitmq, /var/log/rabbitmq); RocketMQ's jars, store
# and logs live under .services/rocketmq in the repository (git-ignored).
set -euo pipefail

# Close every inherited descriptor above stderr, so no daemon started here
# keeps one open for its lifetime (a lock file held by the caller of
# `flock ... scripts/services.sh up` would otherwise stay locked).
self="$(readlink -f "${BASH_SOURCE[0]}")"
for fd in /proc/$$/fd/*; do
	target="$(readlink "$fd" 2>/dev/null || true)"
	fd=${fd##*/}
	# Keep the descriptor bash reads this script through.
	if ((fd > 2)) && [[ $target != "$self" ]]; then eval "exec $fd>&-" 2>/dev/null || true; fi
done
unset self target fd

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SCRIPTS="$ROOT/scripts"
RMQ_DIR="$ROOT/.services/rocketmq"
RMQ_LIB="$RMQ_DIR/lib"
RMQ_LOGS="$RMQ_DIR/logs"
TLS_DIR="$ROOT/.services/tls"
OTELCOL_DIR="$ROOT/.services/otelcol"
OTLP_ENDPOINT='http://127.0.0.1:4318'
MARIADB_TLS=/etc/mysql/delaybridge-tls
RABBIT_TLS=/etc/rabbitmq/delaybridge-tls
START_TIMEOUT="${DELAYBRIDGE_START_TIMEOUT:-120}"
# Where the rabbitmq_delayed_message_exchange .ez for this RabbitMQ lives (see
# rabbit_delayed_plugin); a checkout beside the project's shared folder finds it.
RABBIT_PLUGINS="${DELAYBRIDGE_RABBITMQ_PLUGINS_DIR:-$ROOT/../shared/rabbitmq-plugins}"

MYSQL_DSN='delaybridge:delaybridge@tcp(127.0.0.1:3306)/delaybridge?parseTime=true&multiStatements=true'
AMQP_URL='amqp://delaybridge:delaybridge@127.0.0.1:5672/'
AMQPS_URL='amqps://delaybridge:delaybridge@127.0.0.1:5671/'
NAMESRV='127.0.0.1:9876'

MARIADB_LOG=/var/log/mysql/error.log
RABBIT_STARTUP_LOG=/var/log/rabbitmq/delaybridge-startup.log

log() { printf '%s services: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
now() { date +%s.%N; }
# elapsed START -> seconds since START, one decimal.
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
timing() { printf 'timing: %-28s %6ss\n' "$1" "$2" >&2; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# wait_for NAME TIMEOUT CHECK... : run CHECK every second until it succeeds.
wait_for() {
	local name="$1" timeout="$2" deadline
	shift 2
	deadline=$((SECONDS + timeout))
	until "$@"; do
		if ((SECONDS >= deadline)); then
			return 1
		fi
		sleep 1
	done
}

# fail SERVICE LOGFILE... : print the tail of each log and exit non-zero.
fail() {
	local service="$1" f
	shift
	for f in "$@"; do
		if [[ -f "$f" ]]; then
			echo "----- last 50 lines of $f -----" >&2
			tail -n 50 "$f" >&2
		fi
	done
	die "$service did not start within ${START_TIMEOUT}s (logs above)"
}

pid_alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

# install_file SRC DST : copy only if different; returns 0 if it changed DST.
install_file() {
	if [[ -f "$2" ]] && cmp -s "$1" "$2"; then
		return 1
	fi
	install -m 0644 "$1" "$2"
	log "installed $2"
	return 0
}

# install_secret SRC DST OWNER : like install_file, but mode 0600 owned by
# OWNER (a key only that service's user may read); also fixes owner and mode.
install_secret() {
	local changed=1
	if [[ -f "$2" ]] && cmp -s "$1" "$2"; then
		changed=0
	fi
	install -m 0600 -o "$3" -g "$3" "$1" "$2"
	((changed)) && log "installed $2"
	((changed))
}

# ---------------------------------------------------------------- TLS

# tls_certs: a local CA, a server certificate for 127.0.0.1 and localhost,
# and a client certificate, all signed by that CA, in $TLS_DIR. Made once;
# made again when missing or when the server certificate expires within 30
# days. They protect nothing but these local test services.
tls_certs() {
	local t0
	t0=$(now)
	if [[ -s "$TLS_DIR/ca.pem" && -s "$TLS_DIR/server.pem" && -s "$TLS_DIR/client.pem" ]] &&
		openssl x509 -checkend 2592000 -noout -in "$TLS_DIR/server.pem" >/dev/null 2>&1; then
		timing "tls certificates" "$(elapsed "$t0")"
		return 0
	fi
	log "making a local test CA and certificates in $TLS_DIR"
	rm -rf "$TLS_DIR"
	mkdir -p "$TLS_DIR"
	chmod 0700 "$TLS_DIR"
	(
		cd "$TLS_DIR"
		umask 077
		openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=delaybridge local test CA" \
			-addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
			-keyout ca-key.pem -out ca.pem 2>/dev/null
		# leaf NAME CN EXTENSIONS
		leaf() {
			openssl req -newkey rsa:2048 -nodes -subj "/CN=$2" -keyout "$1-key.pem" -out "$1.csr" 2>/dev/null
			printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" "$3" >"$1.ext"
			openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 825 \
				-extfile "$1.ext" -out "$1.pem" 2>/dev/null
			rm -f "$1.csr" "$1.ext"
		}
		leaf server localhost $'extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost'
		leaf client delaybridge-test-client "extendedKeyUsage=clientAuth"
		chmod 0644 ca.pem server.pem client.pem
	) || die "openssl could not make the test certificates"
	timing "tls certificates" "$(elapsed "$t0")"
}

# ---------------------------------------------------------------- install

ensure_installed() {
	local t0 pkgs=()
	t0=$(now)
	command -v mariadbd >/dev/null 2>&1 || pkgs+=(mariadb-server)
	command -v mariadb >/dev/null 2>&1 || pkgs+=(mariadb-client)
	[[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]] || pkgs+=(rabbitmq-server)
	command -v java >/dev/null 2>&1 || pkgs+=(default-jre-headless)
	command -v openssl >/dev/null 2>&1 || pkgs+=(openssl)
	if [[ ! -d "$RMQ_LIB" ]] || [[ -z "$(ls -A "$RMQ_LIB" 2>/dev/null)" ]]; then
		command -v mvn >/dev/null 2>&1 || pkgs+=(maven)
	fi
	if ((${#pkgs[@]})); then
		[[ $(id -u) -eq 0 ]] || die "need root to apt-get install ${pkgs[*]}"
		log "apt-get install ${pkgs[*]}"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq
		apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
	fi
	timing "install apt" "$(elapsed "$t0")"

	t0=$(now)
	if [[ ! -d "$RMQ_LIB" ]] || [[ -z "$(ls -A "$RMQ_LIB" 2>/dev/null)" ]]; then
		log "fetching RocketMQ jars from Maven Central into $RMQ_LIB"
		mkdir -p "$RMQ_LIB"
		mvn -q -B -Dstyle.color=never -f "$SCRIPTS/rocketmq/pom.xml" dependency:copy-dependencies \
			-DoutputDirectory="$RMQ_LIB"
	fi
	timing "install rocketmq jars" "$(elapsed "$t0")"
}

# ---------------------------------------------------------------- MariaDB

mariadb_up() {
	local t0 changed=0
	t0=$(now)
	install_file "$SCRIPTS/mariadb/delaybridge.cnf" /etc/mysql/mariadb.conf.d/99-delaybridge.cnf && changed=1
	mkdir -p /var/log/mysql /run/mysqld "$MARIADB_TLS"
	chown mysql:adm /var/log/mysql
	chown mysql:root /run/mysqld
	chown mysql:mysql "$MARIADB_TLS"
	chmod 0700 "$MARIADB_TLS"
	local certs=0
	install_secret "$TLS_DIR/ca.pem" "$MARIADB_TLS/ca.pem" mysql && certs=1
	install_secret "$TLS_DIR/server.pem" "$MARIADB_TLS/server.pem" mysql && certs=1
	install_secret "$TLS_DIR/server-key.pem" "$MARIADB_TLS/server-key.pem" mysql && certs=1
	if port_open 3306 && ((!changed)) && [[ "$(mariadb -uroot -N -e "SELECT @@have_ssl" 2>/dev/null)" != YES ]]; then
		log "MariaDB runs without TLS: restarting"
		changed=1
	fi
	if [[ ! -d /var/lib/mysql/mysql ]]; then
		log "initialising MariaDB data directory"
		mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
	fi
	if port_open 3306 && ((changed)); then
		log "MariaDB config changed: restarting"
		mariadb_down
	fi
	if port_open 3306; then
		log "MariaDB already running on 127.0.0.1:3306, reusing"
		if ((certs)); then
			log "MariaDB: new TLS certificates, reloading them (FLUSH SSL)"
			mariadb -uroot -e "FLUSH SSL"
		fi
	else
		log "starting MariaDB"
		# mysqld_safe restarts mariadbd if it crashes; Debian's [mysqld_safe]
		# section logs to syslog, which is not running here, so log to a file.
		nohup setsid mysqld_safe --skip-syslog --log-error="$MARIADB_LOG" \
			</dev/null >/dev/null 2>&1 &
		wait_for MariaDB "$START_TIMEOUT" port_open 3306 || fail MariaDB "$MARIADB_LOG"
		wait_for MariaDB 30 mariadb-admin -uroot --silent ping >/dev/null 2>&1 || fail MariaDB "$MARIADB_LOG"
	fi
	timing "start mariadb" "$(elapsed "$t0")"

	t0=$(now)
	# root@localhost authenticates over the unix socket as the OS root user.
	mariadb -uroot <<-'SQL'
		CREATE DATABASE IF NOT EXISTS delaybridge CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci;
		CREATE USER IF NOT EXISTS 'delaybridge'@'127.0.0.1' IDENTIFIED BY 'delaybridge';
		CREATE USER IF NOT EXISTS 'delaybridge'@'localhost' IDENTIFIED BY 'delaybridge';
		GRANT ALL PRIVILEGES ON `delaybridge`.* TO 'delaybridge'@'127.0.0.1';
		GRANT ALL PRIVILEGES ON `delaybridge`.* TO 'delaybridge'@'localhost';
		GRANT ALL PRIVILEGES ON `delaybridge\_%`.* TO 'delaybridge'@'127.0.0.1';
		GRANT ALL PRIVILEGES ON `delaybridge\_%`.* TO 'delaybridge'@'localhost';
		FLUSH PRIVILEGES;
	SQL
	mariadb -udelaybridge -pdelaybridge -h127.0.0.1 -P3306 delaybridge -N -e \
		'SELECT CONCAT("MariaDB ", VERSION(), ", charset ", @@character_set_server, ", time_zone ", @@global.time_zone, ", TLS ", @@have_ssl)' >&2 ||
		die "MariaDB: user delaybridge cannot log in over TCP"
	timing "setup mariadb" "$(elapsed "$t0")"
}

mariadb_down() {
	if port_open 3306; then
		log "stopping MariaDB"
		mariadb-admin -uroot shutdown || true
		wait_for MariaDB 60 bash -c '! (exec 3<>/dev/tcp/127.0.0.1/3306) 2>/dev/null' || die "MariaDB did not stop"
	fi
	# mariadbd removes its pid file on a clean stop; mysqld_safe then exits.
	wait_for MariaDB 30 bash -c '[[ ! -e /run/mysqld/mysqld.pid ]]' || true
}

# ---------------------------------------------------------------- RabbitMQ

rabbit_log() { echo "/var/log/rabbitmq/rabbit@$(hostname -s).log"; }

rabbit_up() {
	local t0 changed=0
	t0=$(now)
	install_file "$SCRIPTS/rabbitmq/rabbitmq.conf" /etc/rabbitmq/rabbitmq.conf && changed=1
	install_file "$SCRIPTS/rabbitmq/advanced.config" /etc/rabbitmq/advanced.config && changed=1
	mkdir -p "$RABBIT_TLS"
	chown rabbitmq:rabbitmq "$RABBIT_TLS"
	chmod 0700 "$RABBIT_TLS"
	# The listener reads its certificates when it starts: new ones need a restart.
	install_secret "$TLS_DIR/ca.pem" "$RABBIT_TLS/ca.pem" rabbitmq && changed=1
	install_secret "$TLS_DIR/server.pem" "$RABBIT_TLS/server.pem" rabbitmq && changed=1
	install_secret "$TLS_DIR/server-key.pem" "$RABBIT_TLS/server-key.pem" rabbitmq && changed=1
	if port_open 5672 && ! port_open 5671; then
		log "RabbitMQ runs without its TLS listener on 5671"
		changed=1
	fi
	if port_open 5672 && ((changed)); then
		log "RabbitMQ config changed: restarting"
		rabbit_down
	fi
	if port_open 5672; then
		log "RabbitMQ already running on 127.0.0.1:5672, reusing"
	else
		log "starting RabbitMQ"
		mkdir -p /var/log/rabbitmq
		chown rabbitmq:rabbitmq /var/log/rabbitmq
		# The node runs as the rabbitmq user in the foreground of this detached
		# session, its output in the startup log. It inherits the open-files
		# limit raised in this subshell: setpriv keeps it, where the Debian
		# wrapper's su resets it through pam_limits.
		(
			rabbit_nofile
			cd /var/lib/rabbitmq
			exec nohup setsid setpriv --reuid=rabbitmq --regid=rabbitmq --init-groups \
				env HOME=/var/lib/rabbitmq USER=rabbitmq LOGNAME=rabbitmq \
				/usr/lib/rabbitmq/bin/rabbitmq-server </dev/null >"$RABBIT_STARTUP_LOG" 2>&1
		) &
		wait_for RabbitMQ "$START_TIMEOUT" port_open 5672 || fail RabbitMQ "$RABBIT_STARTUP_LOG" "$(rabbit_log)"
		rabbitmqctl -q await_startup --timeout 60 >/dev/null || fail RabbitMQ "$RABBIT_STARTUP_LOG" "$(rabbit_log)"
		wait_for RabbitMQ 30 port_open 5671 || fail "RabbitMQ (TLS listener on 5671)" "$RABBIT_STARTUP_LOG" "$(rabbit_log)"
	fi
	timing "start rabbitmq" "$(elapsed "$t0")"

	t0=$(now)
	rabbitmqctl -q enable_feature_flag quorum_queue >/dev/null
	rabbitmqctl -q enable_feature_flag stream_queue >/dev/null
	if ! rabbitmqctl -q list_users | awk '{print $1}' | grep -qx delaybridge; then
		rabbitmqctl -q add_user delaybridge delaybridge >/dev/null
	else
		rabbitmqctl -q change_password delaybridge delaybridge >/dev/null
	fi
	rabbitmqctl -q set_user_tags delaybridge administrator >/dev/null
	rabbitmqctl -q set_permissions -p / delaybridge '.*' '.*' '.*' >/dev/null
	local prefetch
	prefetch=$(rabbitmqctl -q eval 'application:get_env(rabbit, dead_letter_worker_consumer_prefetch).')
	log "RabbitMQ $(rabbitmqctl -q eval 'rabbit_misc:version().' | tr -d '"'), dead_letter_worker_consumer_prefetch $prefetch"
	rabbit_check_nofile
	rabbit_delayed_plugin
	timing "setup rabbitmq" "$(elapsed "$t0")"
}

# RabbitMQ recommends at least 65536 open files. Each quorum queue takes
# about three, and a node left at 1024 stopped accepting connections after a
# few hundred topic queues.
RABBIT_NOFILE=65536

# rabbit_nofile_target prints the open-files limit rabbit_nofile sets:
# RABBIT_NOFILE, or the hard limit where that is lower and cannot be raised
# (a container without CAP_SYS_RESOURCE).
rabbit_nofile_target() {
	local hard
	hard=$(ulimit -Hn)
	if [[ $hard == unlimited ]] || ((hard >= RABBIT_NOFILE)) || (ulimit -Hn "$RABBIT_NOFILE") 2>/dev/null; then
		echo "$RABBIT_NOFILE"
	else
		echo "$hard"
	fi
}

# rabbit_nofile sets this shell's open-files limit for the node it starts.
rabbit_nofile() {
	local want
	want=$(rabbit_nofile_target)
	if ((want < RABBIT_NOFILE)); then
		log "RabbitMQ: the hard open-files limit is $want, under the $RABBIT_NOFILE RabbitMQ recommends; starting it with $want"
	elif [[ $(ulimit -Hn) != unlimited ]] && (($(ulimit -Hn) < want)); then
		ulimit -Hn "$want"
	fi
	ulimit -n "$want"
}

# rabbit_check_nofile says when the running node has fewer open files than
# rabbit_nofile would give it: a node started before, or by something else.
rabbit_check_nofile() {
	local pid limit want
	pid=$(rabbitmqctl -q eval 'list_to_integer(os:getpid()).' 2>/dev/null) || return 0
	limit=$(awk '/^Max open files/ {print $4}' "/proc/$pid/limits" 2>/dev/null) || return 0
	[[ -n "$limit" ]] || return 0
	want=$(rabbit_nofile_target)
	log "RabbitMQ: open-files limit $limit"
	if [[ $limit != unlimited ]] && ((limit < want)); then
		log "RabbitMQ runs with fewer open files than the $want it would be given: restart it (scripts/services.sh down rabbitmq; scripts/services.sh up)"
	fi
}

# rabbit_delayed_plugin installs the delayed-message exchange plugin from
# $RABBIT_PLUGINS into the node's plugins directory and enables it online (no
# restart). Without that folder it says how to get the plugin and goes on:
# ladder mode needs none, and only the delayed-exchange tests then fail.
rabbit_delayed_plugin() {
	local ez plugins
	ez=$(find "$RABBIT_PLUGINS" -maxdepth 1 -name 'rabbitmq_delayed_message_exchange-*.ez' 2>/dev/null | sort | tail -n1 || true)
	if [[ -z "$ez" ]]; then
		log "no rabbitmq_delayed_message_exchange-*.ez in $RABBIT_PLUGINS: delayed-exchange mode and its tests need it."
		log "  Get the release built for RabbitMQ $(rabbitmqctl -q eval 'rabbit_misc:version().' | tr -d '"' | cut -d. -f1,2).x from"
		log "  https://github.com/rabbitmq/rabbitmq-delayed-message-exchange/releases into that folder"
		log "  (or set DELAYBRIDGE_RABBITMQ_PLUGINS_DIR to where it is) and run scripts/services.sh up again."
		return 0
	fi
	plugins=$(find /usr/lib/rabbitmq/lib -maxdepth 2 -type d -name plugins -path '*rabbitmq_server-*' | sort | tail -n1)
	[[ -n "$plugins" ]] || die "RabbitMQ's plugins directory not found under /usr/lib/rabbitmq/lib"
	if ! install_file "$ez" "$plugins/$(basename "$ez")" &&
		rabbitmq-plugins -q is_enabled rabbitmq_delayed_message_exchange >/dev/null 2>&1; then
		return 0
	fi
	rabbitmq-plugins -q enable rabbitmq_delayed_message_exchange >/dev/null ||
		die "rabbitmq-plugins enable rabbitmq_delayed_message_exchange failed (is $(basename "$ez") built for this RabbitMQ?)"
	log "RabbitMQ: rabbitmq_delayed_message_exchange enabled from $ez"
}

rabbit_down() {
	if port_open 5672 || rabbitmqctl -q status >/dev/null 2>&1; then
		log "stopping RabbitMQ"
		rabbitmqctl -q shutdown >/dev/null 2>&1 || rabbitmqctl -q stop >/dev/null 2>&1 || true
		wait_for RabbitMQ 60 bash -c '! (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null' || die "RabbitMQ did not stop"
	fi
}

# ---------------------------------------------------------------- RocketMQ

rmq_java() {
	# $1: pid file, $2: logback config, $3: heap options, rest: main class and
	# arguments. Runs in a background subshell: records its own pid, then
	# becomes java in a new session (so a Ctrl-C in the caller's terminal does
	# not reach it). The jars' logback configs write under
	# ${user.home}/logs/rocketmqlogs, hence user.home; the config is named
	# because logback would otherwise take the first one on the classpath
	# (the broker's) for the name server too. TLS is off: in its default
	# "permissive" mode each server makes a self-signed certificate at start,
	# which took 20-30 s of blocking on entropy on the test box.
	local pidfile="$1" logback="$2" heap="$3"
	shift 3
	echo "$BASHPID" >"$pidfile"
	# shellcheck disable=SC2086
	exec setsid java -server $heap -XX:+UseG1GC -XX:MaxDirectMemorySize=512m \
		-XX:-OmitStackTraceInFastThrow -Djava.net.preferIPv4Stack=true \
		--add-opens java.base/java.nio=ALL-UNNAMED \
		--add-opens java.base/sun.nio.ch=ALL-UNNAMED \
		--add-opens java.base/java.lang=ALL-UNNAMED \
		-Duser.home="$RMQ_DIR" -Drocketmq.home.dir="$RMQ_DIR" \
		-Drmq.logback.configurationFile="$logback" \
		-Dtls.server.mode=disabled -Djava.security.egd=file:/dev/./urandom \
		-cp "$RMQ_LIB/*" "$@"
}

broker_registered() {
	"$SCRIPTS/mqadmin.sh" clusterList 2>/dev/null | grep -q '127.0.0.1:10911'
}

rocketmq_up() {
	local t0 started=0
	t0=$(now)
	mkdir -p "$RMQ_LOGS" "$RMQ_DIR/store"
	export ROCKETMQ_HOME="$RMQ_DIR"

	if port_open 9876; then
		log "RocketMQ namesrv already running on 127.0.0.1:9876, reusing"
	else
		log "starting RocketMQ namesrv"
		(rmq_java "$RMQ_DIR/namesrv.pid" rmq.namesrv.logback.xml "-Xms256m -Xmx512m" org.apache.rocketmq.namesrv.NamesrvStartup) \
			</dev/null >"$RMQ_LOGS/namesrv.out" 2>&1 &
		wait_for namesrv "$START_TIMEOUT" port_open 9876 ||
			fail "RocketMQ namesrv" "$RMQ_LOGS/namesrv.out" "$RMQ_LOGS/rocketmqlogs/namesrv.log"
	fi
	timing "start rocketmq namesrv" "$(elapsed "$t0")"

	t0=$(now)
	sed "s|@ROCKETMQ_DIR@|$RMQ_DIR|g" "$SCRIPTS/rocketmq/broker.conf" >"$RMQ_DIR/broker.conf.new"
	if [[ -f "$RMQ_DIR/broker.conf" ]] && ! cmp -s "$RMQ_DIR/broker.conf.new" "$RMQ_DIR/broker.conf" && port_open 10911; then
		log "RocketMQ broker config changed: restarting the broker"
		stop_pid broker "$RMQ_DIR/broker.pid" org.apache.rocketmq.broker.BrokerStartup 10911
	elif port_open 10911 && ! pid_alive "$RMQ_DIR/broker.pid"; then
		# Started from another checkout (CI's fresh clone on a machine where
		# one already runs them): the fault tests stop and start the broker
		# through this checkout's pid file and store, so this checkout
		# takes it over. The other checkout's store stays where it is.
		log "RocketMQ broker on 127.0.0.1:10911 was not started from this checkout: restarting it from here"
		stop_pid broker "$RMQ_DIR/broker.pid" org.apache.rocketmq.broker.BrokerStartup 10911
	fi
	mv "$RMQ_DIR/broker.conf.new" "$RMQ_DIR/broker.conf"
	if port_open 10911; then
		log "RocketMQ broker already running on 127.0.0.1:10911, reusing"
	else
		log "starting RocketMQ broker"
		started=1
		(rmq_java "$RMQ_DIR/broker.pid" rmq.broker.logback.xml "-Xms512m -Xmx1g" org.apache.rocketmq.broker.BrokerStartup -c "$RMQ_DIR/broker.conf") \
			</dev/null >"$RMQ_LOGS/broker.out" 2>&1 &
		wait_for broker "$START_TIMEOUT" port_open 10911 ||
			fail "RocketMQ broker" "$RMQ_LOGS/broker.out" "$RMQ_LOGS/rocketmqlogs/broker.log"
	fi
	wait_for broker "$START_TIMEOUT" broker_registered ||
		fail "RocketMQ broker (not registered in namesrv)" "$RMQ_LOGS/broker.out" "$RMQ_LOGS/rocketmqlogs/broker.log"
	timing "start rocketmq broker" "$(elapsed "$t0")"
	((started)) || return 0
	"$SCRIPTS/mqadmin.sh" getBrokerConfig -b 127.0.0.1:10911 2>/dev/null |
		grep -E '^(timerWheelEnable|timerMaxDelaySec|timerPrecisionMs|brokerIP1|autoCreateTopicEnable) ' |
		sed 's/^/  rocketmq: /; s/  */ /g' >&2 || true
}

# listener_pid PORT: the pid of the process listening on 127.0.0.1:PORT, if any.
listener_pid() {
	{ ss -Hltnp "sport = :$1" 2>/dev/null || true; } | sed -n 's/.*pid=\([0-9]*\).*/\1/p' | head -n1
}

# stop_pid NAME PIDFILE CLASS [PORT]: SIGTERM (RocketMQ's shutdown hooks run),
# then SIGKILL after 30 s, to the process in PIDFILE or, when that is not
# alive (a server started from another checkout), the one listening on PORT,
# else the first process running the JVM main CLASS.
stop_pid() {
	local name="$1" pidfile="$2" class="$3" port="${4:-}" pid=""
	if pid_alive "$pidfile"; then
		pid=$(cat "$pidfile")
	else
		[[ -n "$port" ]] && pid=$(listener_pid "$port")
		[[ -z "$pid" ]] && pid=$(pgrep -f "$class" | head -n1 || true)
		[[ -n "$pid" ]] && log "RocketMQ $name runs without this checkout's pid file (pid $pid, started elsewhere)"
	fi
	if [[ -n "$pid" ]]; then
		log "stopping RocketMQ $name (pid $pid)"
		kill "$pid" 2>/dev/null || true
		if ! wait_for "$name" 30 bash -c "! kill -0 $pid 2>/dev/null"; then
			log "RocketMQ $name did not stop in 30s, killing"
			kill -9 "$pid" 2>/dev/null || true
		fi
	fi
	rm -f "$pidfile"
}

rocketmq_down() {
	stop_pid broker "$RMQ_DIR/broker.pid" org.apache.rocketmq.broker.BrokerStartup 10911
	stop_pid namesrv "$RMQ_DIR/namesrv.pid" org.apache.rocketmq.namesrv.NamesrvStartup 9876
}

# otelcol_up builds the test collector when its sources are newer than the
# binary (Go fetches its modules from the proxy; the build cache keeps
# later builds short), then starts it unless port 4318 already listens. It
# writes every span it receives to $OTELCOL_DIR/otelcol.log. One started
# from another checkout is stopped and started again from this one.
otelcol_up() {
	local t0 bin="$OTELCOL_DIR/otelcol"
	t0=$(now)
	mkdir -p "$OTELCOL_DIR"
	if [[ ! -x "$bin" ]] || [[ -n "$(find "$SCRIPTS/otelcol" -newer "$bin" -type f)" ]]; then
		log "building the test OpenTelemetry Collector (scripts/otelcol)"
		command -v go >/dev/null 2>&1 || die "otelcol: go is not on the PATH"
		(cd "$SCRIPTS/otelcol" && go build -o "$bin.new" . && mv "$bin.new" "$bin") || die "otelcol: build failed"
	fi
	# The tests read this checkout's log: a collector started from another
	# checkout (or by hand) is replaced.
	if port_open 4318 && ! pid_alive "$OTELCOL_DIR/otelcol.pid"; then
		log "otelcol on 4318 is not this checkout's; restarting it from here"
		otelcol_down
		wait_for otelcol 30 bash -c "! (exec 3<>/dev/tcp/127.0.0.1/4318) 2>/dev/null" || die "otelcol: port 4318 stays taken"
	fi
	if port_open 4318; then
		log "otelcol already listening on 4318"
	else
		log "starting otelcol"
		nohup "$bin" --config "file:$SCRIPTS/otelcol/config.yaml" >"$OTELCOL_DIR/otelcol.log" 2>&1 &
		echo $! >"$OTELCOL_DIR/otelcol.pid"
		wait_for otelcol 60 port_open 4318 || fail otelcol "$OTELCOL_DIR/otelcol.log"
	fi
	timing "otelcol up" "$(elapsed "$t0")"
}

otelcol_down() {
	local pid=""
	if pid_alive "$OTELCOL_DIR/otelcol.pid"; then
		pid=$(cat "$OTELCOL_DIR/otelcol.pid")
	else
		pid=$(listener_pid 4318)
	fi
	if [[ -n "$pid" ]]; then
		log "stopping otelcol (pid $pid)"
		kill "$pid" 2>/dev/null || true
		wait_for otelcol 30 bash -c "! kill -0 $pid 2>/dev/null" || kill -9 "$pid" 2>/dev/null || true
	fi
	rm -f "$OTELCOL_DIR/otelcol.pid"
}

# ---------------------------------------------------------------- commands

cmd_up() {
	local t0
	t0=$(now)
	ensure_installed
	tls_certs
	mariadb_up
	rabbit_up
	rocketmq_up
	otelcol_up
	timing "up total" "$(elapsed "$t0")"
	cmd_status
}

cmd_down() {
	# No argument: every service. Otherwise only those named, e.g.
	# "down rocketmq" before a RabbitMQ benchmark that should have the cores
	# to itself; "up" starts it again.
	local s
	(($#)) || set -- otelcol rocketmq rabbitmq mariadb
	for s in "$@"; do
		case "$s" in
		otelcol | rocketmq | rabbitmq | mariadb) ;;
		*) die "down: unknown service $s (want otelcol, rocketmq, rabbitmq or mariadb); nothing stopped" ;;
		esac
	done
	for s in "$@"; do
		case "$s" in
		otelcol) otelcol_down ;;
		rocketmq) rocketmq_down ;;
		rabbitmq) rabbit_down ;;
		mariadb) mariadb_down ;;
		esac
	done
	cmd_status
}

cmd_status() {
	local name port
	for entry in "mariadb 3306" "rabbitmq 5672" "rocketmq-namesrv 9876" "rocketmq-broker 10911" "otelcol 4318"; do
		read -r name port <<<"$entry"
		if port_open "$port"; then
			printf '%-17s up   (127.0.0.1:%s)\n' "$name" "$port"
		else
			printf '%-17s down\n' "$name"
		fi
	done
}

cmd_env() { # export lines: eval "$(scripts/services.sh env)" passes them to the commands run after it
	cat <<-EOF
		export DELAYBRIDGE_MYSQL_DSN='$MYSQL_DSN'
		export DELAYBRIDGE_AMQP_URL='$AMQP_URL'
		export DELAYBRIDGE_ROCKETMQ_NAMESRV='$NAMESRV'
		export DELAYBRIDGE_RABBITMQCTL=rabbitmqctl
		export DELAYBRIDGE_MQADMIN='$SCRIPTS/mqadmin.sh'
		export DELAYBRIDGE_ROCKETMQ_BROKER_ADDR='127.0.0.1:10911'
		export DELAYBRIDGE_ROCKETMQ_MAX_DELAY='1h'
		export DELAYBRIDGE_ROCKETMQ_PRECISION='100ms'
		export DELAYBRIDGE_TEST_AMQPS_URL='$AMQPS_URL'
		export DELAYBRIDGE_TEST_TLS_CA='$TLS_DIR/ca.pem'
		export DELAYBRIDGE_TEST_TLS_CLIENT_CERT='$TLS_DIR/client.pem'
		export DELAYBRIDGE_TEST_TLS_CLIENT_KEY='$TLS_DIR/client-key.pem'
		export DELAYBRIDGE_TEST_OTLP_ENDPOINT='$OTLP_ENDPOINT'
		export DELAYBRIDGE_TEST_OTELCOL_LOG='$OTELCOL_DIR/otelcol.log'
	EOF
}

case "${1:-}" in
up) cmd_up ;;
down)
	shift
	cmd_down "$@"
	;;
status) cmd_status ;;
env) cmd_env ;;
*)
	echo "usage: $0 up|down [otelcol|rocketmq|rabbitmq|mariadb ...]|status|env" >&2
	exit 2
	;;
esac
