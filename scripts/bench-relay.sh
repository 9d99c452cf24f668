#!/usr/bin/env bash
# The relay against a raw confirmed publish (BENCHMARKS.md, "Relay
# throughput").
#
#   scripts/bench-relay.sh rabbit|rocket [tasks] [runs] [bench flags...]
#
# Runs `bench --broker B --tasks N --preload --relay-only --baseline` with
# the defaults (plus any bench flags given after runs, to compare relay
# settings), runs times (default 5): each run first publishes the tasks
# straight through the adapter (the baseline), then relays as many
# scheduled rows. On a box whose cores the database, the broker and
# delaybridge share, one run's ratio swings with what else the servers do
# (RabbitMQ's baseline alone varies by a third between runs), so the script
# prints every run and the median ratio. Before each run it empties what the
# last left for the bench's consumer and waits for MariaDB to go quiet. On
# RocketMQ it deletes the bench's topic (the bench creates it again) and
# the offsets of the bench's consumer group: a consumer group new to a topic
# whose messages the broker still holds in memory starts from the first of
# them, so a later bench or test run with a new group would first wade
# through everything these runs left.
#
# Each run also shows where the CPU went in each phase (the baseline, then
# the relay): how busy the box was and the CPU per message of MariaDB, the
# broker and the bench process, sampled every 100 ms from /proc ("other" is
# the rest of the box: the kernel, the name server, this script; sampled a
# moment apart from the processes, it can read a few µs below zero). From
# them it prints the most relay/baseline the run allowed: the relay's rate
# if it had every core and the broker and delaybridge cost no more per
# relayed row than per baseline message, so that only MariaDB's claim and
# mark of each row came on top. A goal above that is out of reach on the
# box with two database writes a row. Needs the local services
# (scripts/services.sh up) and bin/delaybridge.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
broker=${1:?usage: scripts/bench-relay.sh rabbit|rocket [tasks] [runs]}
tasks=${2:-100000}
runs=${3:-5}
shift $(($# < 3 ? $# : 3))
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
	# A run's messages are due 2 s after they were scheduled (the bench's
	# default delay), and the relay finished publishing them only just now:
	# some are still in RabbitMQ's ladder or RocketMQ's timer. Let them all
	# come due first, or they arrive after the clean-up and the next bench
	# on the topic wades through them (RocketMQ creates the deleted topic
	# again to deliver them).
	sleep 5
	if [ "$broker" = rabbit ]; then
		rabbitmqctl purge_queue -q delaybridge.q.delaybridge-bench > /dev/null 2>&1 || true
	else
		scripts/mqadmin.sh deleteTopic -c DefaultCluster -t delaybridge-bench > /dev/null 2>&1 ||
			echo "bench-relay.sh: could not delete the topic delaybridge-bench; the next bench consumes what the runs left" >&2
		# And the bench consumer group's offsets: they point past the end of
		# the topic the next bench creates afresh, and a consumer asking for
		# such an offset is told it moved, sleeps 10 s and waits for its next
		# rebalance (up to 20 s) before it pulls again.
		scripts/mqadmin.sh deleteSubGroup -c DefaultCluster -g delaybridge-delaybridge-bench -r true > /dev/null 2>&1 ||
			echo "bench-relay.sh: could not delete the consumer group delaybridge-delaybridge-bench; the next bench may start seconds late" >&2
	fi
}
field() { sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p"; }
server() { # the broker's server process
	if [ "$broker" = rabbit ]; then
		pgrep -f 'beam.smp.*rabbit' | head -1
	else
		pgrep -f 'org.apache.rocketmq.broker.BrokerStartup' | head -1
	fi
}
# sample PID... prints every 100 ms: microseconds since the epoch, the box's
# busy and total jiffies (/proc/stat: user nice system idle iowait irq
# softirq steal) and each PID's CPU jiffies (0 once it is gone). Builtins
# only, so the sampler itself costs next to nothing.
sample() {
	local fd f s p line
	exec {fd}<> <(:)
	while :; do
		read -r -a f < /proc/stat
		line="${EPOCHREALTIME/./} $((f[1] + f[2] + f[3] + f[6] + f[7] + f[8])) $((f[1] + f[2] + f[3] + f[4] + f[5] + f[6] + f[7] + f[8]))"
		for p in "$@"; do
			if read -r -a s < "/proc/$p/stat" 2> /dev/null; then line+=" $((s[13] + s[14]))"; else line+=" 0"; fi
		done
		echo "$line"
		read -rt 0.1 -u "$fd" _ || true
	done
}
# phases SAMPLES JSON: the CPU table of one run and MariaDB's ratio.
phases() {
	awk -v json="$2" -v n="$tasks" -v hz="$HZ" -v cores="$(nproc)" -v name="$broker" '
		function num(k,   m) { return match(json, "\"" k "\":[0-9.]+") ? substr(json, RSTART + length(k) + 3, RLENGTH - length(k) - 3) + 0 : 0 }
		{ t[NR] = $1 / 1000; for (i = 2; i <= NF; i++) v[NR, i] = $i }
		END {
			split("baseline relay", ph, " ")
			printf "  %-9s %9s %9s %9s %12s %7s   (CPU µs per message)\n", "phase", "box busy", "mariadb", name, "delaybridge", "other"
			for (p = 1; p <= 2; p++) {
				a = num(ph[p] "_start_unix_ms"); b = num(ph[p] "_end_unix_ms")
				f = 0; l = 0
				for (r = 1; r <= NR; r++) { if (!f && t[r] >= a) f = r; if (t[r] <= b) l = r }
				if (!f || l <= f) { printf "  %-9s too short to sample\n", ph[p]; ok = 0; continue }
				ok = 1
				# per message over the whole phase, scaled from the sampled part
				s = 1e6 / hz / n * (b - a) / (t[l] - t[f])
				box = (v[l, 2] - v[f, 2]) * s; db = (v[l, 4] - v[f, 4]) * s; br = (v[l, 5] - v[f, 5]) * s; me = (v[l, 6] - v[f, 6]) * s
				printf "  %-9s %8.0f%% %9.0f %9.0f %12.0f %7.0f\n", ph[p], 100 * (v[l, 2] - v[f, 2]) / (v[l, 3] - v[f, 3]), db, br, me, box - db - br - me
				total[p] = box; mariadb[p] = db
			}
			if (ok && total[1] > 0) {
				rate = num("baseline_publish_tps")
				extra = mariadb[2] - mariadb[1]
				printf "  MariaDB alone allows relay/baseline %.2f at most: %.0f µs more a row than in the baseline, on top of the baseline'"'"'s %.0f µs a message\n", cores * 1e6 / ((total[1] + extra) * rate), extra, total[1]
			}
		}' "$1"
}

samples=$(mktemp)
trap 'rm -f "$samples"' EXIT
ratios=()
for i in $(seq 1 "$runs"); do
	empty_broker
	quiet
	raw=$(mktemp)
	"$bin" bench --broker "$broker" --tasks "$tasks" --preload --relay-only --baseline --json "$@" > "$raw" 2> /dev/null &
	bench=$!
	sample "$(pgrep -x mariadbd | head -1)" "$(server)" "$bench" > "$samples" &
	sampler=$!
	wait "$bench" || true
	kill "$sampler" 2> /dev/null || true
	wait "$sampler" 2> /dev/null || true
	out=$(tail -1 "$raw")
	rm -f "$raw"
	relay=$(echo "$out" | field relay_tps)
	base=$(echo "$out" | field baseline_publish_tps)
	ratio=$(awk -v r="$relay" -v b="$base" 'BEGIN { printf "%.2f", r / b }')
	ratios+=("$ratio")
	printf '%s run %d, %d tasks: baseline %.0f/s, relay %.0f/s, relay/baseline %s\n' "$broker" "$i" "$tasks" "$base" "$relay" "$ratio"
	phases "$samples" "$out"
done
empty_broker
printf '%s\n' "${ratios[@]}" | sort -n | awk '{ v[NR] = $1 } END { printf "median relay/baseline %.2f (%d runs, %.2f to %.2f)\n", v[int((NR + 1) / 2)], NR, v[1], v[NR] }'
