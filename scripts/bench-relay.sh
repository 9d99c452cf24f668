#!/usr/bin/env bash
# The relay against a raw confirmed publish (BENCHMARKS.md, "Relay
# throughput").
#
#   scripts/bench-relay.sh rabbit|rocket [tasks] [runs]
#
# Runs `bench --broker B --tasks N --preload --relay-only --baseline` with
# the defaults, runs times (default 5): each run first publishes the tasks
# straight through the adapter (the baseline), then relays as many
# scheduled rows. On a box whose cores the database, the broker and
# delaybridge share, one run's ratio swings with what else the servers do
# (RabbitMQ's baseline alone varies by a third between runs), so the script
# prints every run and the median ratio. Before each run it empties what the
# last left for the bench's consumer and waits for MariaDB to go quiet. On
# RocketMQ it deletes the bench's topic (the bench creates it again): a
# consumer group new to a topic whose messages the broker still holds in
# memory starts from the first of them, so a later bench or test run with a
# new group would first wade through everything these runs left. Needs the
# local services (scripts/services.sh up) and bin/delaybridge.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
broker=${1:?usage: scripts/bench-relay.sh rabbit|rocket [tasks] [runs]}
tasks=${2:-100000}
runs=${3:-5}
set -a
eval "$(scripts/services.sh env)"
set +a
HZ=$(getconf CLK_TCK)
bin=${BENCH_BIN:-bin/delaybridge}

quiet() { # MariaDB under 5 % of a core for two seconds (InnoDB purged the last run)
	"$bin" bench --tasks 1 --relay-only --database-only --log-level error > /dev/null 2>&1
	local db a b
	db=$(pgrep -x mariadbd | head -1)
	for _ in $(seq 1 60); do
		a=$(awk '{ print $14 + $15 }' "/proc/$db/stat"); sleep 2; b=$(awk '{ print $14 + $15 }' "/proc/$db/stat")
		[ $(((b - a) * 100 / (2 * HZ))) -lt 5 ] && break
	done
}
empty_broker() {
	if [ "$broker" = rabbit ]; then
		rabbitmqctl purge_queue -q delaybridge.q.delaybridge-bench > /dev/null 2>&1 || true
	else
		scripts/mqadmin.sh deleteTopic -c DefaultCluster -t delaybridge-bench > /dev/null 2>&1 ||
			echo "bench-relay.sh: could not delete the topic delaybridge-bench; the next bench consumes what the runs left" >&2
	fi
}
field() { sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p"; }

ratios=()
for i in $(seq 1 "$runs"); do
	empty_broker
	quiet
	out=$("$bin" bench --broker "$broker" --tasks "$tasks" --preload --relay-only --baseline --json 2> /dev/null | tail -1)
	relay=$(echo "$out" | field relay_tps)
	base=$(echo "$out" | field baseline_publish_tps)
	ratio=$(awk -v r="$relay" -v b="$base" 'BEGIN { printf "%.2f", r / b }')
	ratios+=("$ratio")
	printf '%s run %d, %d tasks: baseline %.0f/s, relay %.0f/s, relay/baseline %s\n' "$broker" "$i" "$tasks" "$base" "$relay" "$ratio"
done
empty_broker
printf '%s\n' "${ratios[@]}" | sort -n | awk '{ v[NR] = $1 } END { printf "median relay/baseline %.2f (%d runs, %.2f to %.2f)\n", v[int((NR + 1) / 2)], NR, v[1], v[NR] }'
