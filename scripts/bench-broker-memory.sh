#!/usr/bin/env bash
# Broker memory with a week of waiting tasks (BENCHMARKS.md, "Broker memory").
#
#   scripts/bench-broker-memory.sh [TASKS] [SECONDS]
#
# Loads TASKS (default 1,000,000) pending tasks due evenly over the next 1 to
# 7 days into a scratch database, then runs `delaybridge run` with nothing but
# the connection settings for SECONDS (default 60) against RabbitMQ and then
# RocketMQ, and prints each broker's resident memory before and after, with
# what the relay published. Needs the local services (scripts/services.sh up)
# and bin/delaybridge (make bin/delaybridge). Drops the scratch database and
# deletes its RabbitMQ queues at the end. With CONTRAST=1 it first runs
# RabbitMQ with --lookahead 0 (every pending task at once, the behaviour
# before the lookahead had a default) on a copy of the rows, for comparison.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TASKS="${1:-1000000}"
SECS="${2:-60}"
DB=delaybridge_memtest
PREFIX=memtest
set -a
eval "$(scripts/services.sh env)"
set +a
DSN="delaybridge:delaybridge@tcp(127.0.0.1:3306)/$DB?parseTime=true"
sql() { mysql -udelaybridge -pdelaybridge -h127.0.0.1 -N "$@"; }

rss_mb() { # PID -> resident MB
	awk '/VmRSS/ { printf "%.0f", $2 / 1024 }' "/proc/$1/status"
}
rabbit_pid() { pgrep -f 'beam.smp.*rabbit' | head -1; }
rocket_pid() { pgrep -f 'org.apache.rocketmq.broker.BrokerStartup' | head -1; }

cleanup() {
	sql -e "DROP DATABASE IF EXISTS $DB" 2>/dev/null || true
	for q in $(rabbitmqctl list_queues -q name 2>/dev/null | grep "^$PREFIX\." || true); do
		rabbitmqctl delete_queue -q "$q" >/dev/null 2>&1 || true
	done
}
trap cleanup EXIT

cleanup
sql -e "CREATE DATABASE $DB"
bin/delaybridge migrate --mysql-dsn "$DSN" >/dev/null
day=86400000
now=$(($(date +%s) * 1000))
start=$(date +%s)
for ((lo = 1; lo <= TASKS; lo += 500000)); do
	hi=$((lo + 499999 < TASKS ? lo + 499999 : TASKS))
	sql "$DB" -e "INSERT INTO delay_task (topic, task_key, due_ms, payload, state, created_ms, updated_ms)
SELECT CONCAT('week-', seq % 20), CONCAT('k-', seq), $now + $day + seq * (6 * $day) DIV $TASKS, REPEAT('x', 100), 'pending', $now, $now
FROM seq_${lo}_to_${hi}"
done
echo "loaded $TASKS tasks due in 1 to 7 days in $(($(date +%s) - start)) s"

run_one() { # BROKER PID-FUNCTION EXTRA-FLAGS...
	local broker="$1" pidf="$2" pid before after published
	shift 2
	pid="$($pidf)"
	before="$(rss_mb "$pid")"
	bin/delaybridge run --broker "$broker" --mysql-dsn "$DSN" --http 127.0.0.1:0 --log-level warn "$@" >/dev/null &
	local runpid=$!
	sleep "$SECS"
	kill -INT "$runpid"
	wait "$runpid" || true
	after="$(rss_mb "$pid")"
	published="$(sql "$DB" -e "SELECT COUNT(*) FROM delay_task WHERE state <> 'pending'")"
	printf '%-8s RSS before %5s MB, after %ss of run %5s MB (%+d MB); tasks published %s of %s\n' \
		"$broker" "$before" "$SECS" "$after" $((after - before)) "$published" "$TASKS"
}

if [[ "${CONTRAST:-}" == 1 ]]; then
	sql "$DB" -e "CREATE TABLE pending_copy AS SELECT * FROM delay_task"
	run_one rabbit rabbit_pid --amqp-url "$DELAYBRIDGE_AMQP_URL" --rabbit-prefix "$PREFIX" --lookahead 0
	for q in $(rabbitmqctl list_queues -q name 2>/dev/null | grep "^$PREFIX\." || true); do
		rabbitmqctl delete_queue -q "$q" >/dev/null 2>&1 || true
	done
	sql "$DB" -e "DELETE FROM delay_task; INSERT INTO delay_task SELECT * FROM pending_copy; DROP TABLE pending_copy"
fi
run_one rabbit rabbit_pid --amqp-url "$DELAYBRIDGE_AMQP_URL" --rabbit-prefix "$PREFIX"
run_one rocket rocket_pid --rocketmq-namesrv "$DELAYBRIDGE_ROCKETMQ_NAMESRV"
