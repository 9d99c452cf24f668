#!/usr/bin/env bash
# Where the CPU of one bench run goes (BENCHMARKS.md, "What a task costs").
#
#   scripts/bench-cpu.sh [delaybridge bench flags...]
#
# Runs `bin/delaybridge bench` with the flags given (add --json) and prints,
# for the local MariaDB, RabbitMQ, RocketMQ (name server and broker) and the
# bench process itself, the CPU seconds each used during the run and per
# handled task, and what that rate of tasks would need in cores. Waits for
# the database to go quiet first (InnoDB purges what earlier runs left).
# Needs the local services (scripts/services.sh up) and bin/delaybridge.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
set -a
eval "$(scripts/services.sh env)"
set +a
HZ=$(getconf CLK_TCK)

pids() { # name pid, for every server running
	local p
	p=$(pgrep -x mariadbd | head -1 || true) && [ -n "$p" ] && echo "mariadb $p"
	p=$(pgrep -f 'beam.smp.*rabbit' | head -1 || true) && [ -n "$p" ] && echo "rabbitmq $p"
	p=$(pgrep -f 'org.apache.rocketmq.namesrv.NamesrvStartup' | head -1 || true) && [ -n "$p" ] && echo "rocketmq-namesrv $p"
	p=$(pgrep -f 'org.apache.rocketmq.broker.BrokerStartup' | head -1 || true) && [ -n "$p" ] && echo "rocketmq-broker $p"
	return 0
}
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

# Quiet first: remove what an earlier run left (bench deletes its old rows
# when it starts, which is not this run's work), then wait until MariaDB
# uses under 5% of a core for two seconds (InnoDB purges those deletes).
bin/delaybridge bench --tasks 1 --relay-only --database-only --log-level error > /dev/null
db=$(pgrep -x mariadbd | head -1)
for _ in $(seq 1 60); do
	a=$(ticks "$db"); sleep 2; b=$(ticks "$db")
	[ $(((b - a) * 100 / (2 * HZ))) -lt 5 ] && break
done

declare -A before
while read -r name pid; do before[$name]="$pid $(ticks "$pid")"; done < <(pids)
start=$(date +%s.%N)
out=$(mktemp)
# The bench's own CPU comes from its JSON (process_cpu_s); its exit status
# is reported, not fatal, so a run that lost tasks still shows its cost.
set +e
${BENCH_BIN:-bin/delaybridge} bench "$@" > "$out"
status=$?
set -e
elapsed=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
json=$(tail -1 "$out")
cat "$out"
rm -f "$out"
handled=$(echo "$json" | sed -n 's/.*"handled":\([0-9]*\).*/\1/p')
handled=${handled:-$(echo "$json" | sed -n 's/.*"scheduled":\([0-9]*\).*/\1/p')}
self=$(echo "$json" | sed -n 's/.*"process_cpu_s":\([0-9.]*\).*/\1/p')
printf '\n%-18s %10s %14s\n' process "cpu s" "µs per task"
rows=""
for name in "${!before[@]}"; do
	read -r pid t0 <<< "${before[$name]}"
	[ -r "/proc/$pid/stat" ] || continue
	rows+="$name $(awk -v a="$t0" -v b="$(ticks "$pid")" -v hz="$HZ" 'BEGIN { print (b - a) / hz }')"$'\n'
done
[ -n "$self" ] && rows+="delaybridge-bench $self"$'\n'
printf '%s' "$rows" | awk -v n="$handled" -v cores="$(nproc)" -v secs="$elapsed" '
	{ printf "%-18s %10.2f %14.0f\n", $1, $2, $2 * 1e6 / n; total += $2 }
	END {
		printf "%-18s %10.2f %14.0f\n", "total", total, total * 1e6 / n
		printf "tasks %d in %ss; at 5,000 tasks/s this work needs %.2f cores, the box has %d: it carries at most %.0f tasks/s\n", n, secs, total / n * 5000, cores, cores * n / total
	}'
exit $status
