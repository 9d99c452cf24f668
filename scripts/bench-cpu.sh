#!/usr/bin/env bash
# Where the CPU of one bench run goes (BENCHMARKS.md, "What a task costs").
#
#   scripts/bench-cpu.sh [delaybridge bench flags...]
#
# Runs `bin/delaybridge bench` with the flags given (add --json) and prints,
# for the local MariaDB, RabbitMQ, RocketMQ (name server and broker) and the
# bench process itself, the CPU seconds each used during the run and per
# handled task, and what that rate of tasks would need in cores; then how
# busy the whole box was from the first task due to the last handled, how
# much of that was steal (a virtual machine's cores given to another guest)
# and the CPU a task took there, steal left out. With
# --floor it prints that for the floor's run too (the database alone, just
# before), so the two windows compare in one run. It also prints MariaDB's
# statements, commits and rows per task. Waits for the database to
# go quiet first (InnoDB purges what earlier runs left).
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

# The whole box's busy and total jiffies (/proc/stat) and each watched
# process's CPU ticks every 100 ms, with builtins only, so the sampler
# itself costs next to nothing: after the run they say how busy the box was
# from the first task due to the last handled, the work that could not be
# done ahead of time, and which process did it. A line is
# "<µs since epoch> <the cpu line of /proc/stat> | name=ticks ...".
watch=$(mktemp) # name pid, one process a line: the servers, then the bench
samples=$(mktemp)
out=$(mktemp)
sampler=""
# Under set -e a failing command ends the trap too: the sampler is gone by
# the time a finished run exits, so its kill must not stop the clean-up.
trap '{ [ -z "$sampler" ] || kill "$sampler" 2> /dev/null; } || true; rm -f "$samples" "$watch" "$out"' EXIT
sample() {
	local fd line name pid procs f
	exec {fd}<> <(:)
	while :; do
		read -r line < /proc/stat
		procs=""
		while read -r name pid; do
			read -r -a f < "/proc/$pid/stat" 2> /dev/null || continue
			procs+=" $name=$((f[13] + f[14]))"
		done < "$watch"
		echo "${EPOCHREALTIME/./} $line |$procs"
		read -rt 0.1 -u "$fd" _ || true
	done
}
pids > "$watch"
sample > "$samples" &
sampler=$!

declare -A before
while read -r name pid; do before[$name]="$pid $(ticks "$pid")"; done < <(pids)
# MariaDB's statement and row counters, before and after: what the
# database did per task (schedule, relay, consumer and the handler's row).
counters="'Questions','Com_commit','Com_insert','Com_update','Com_select','Com_delete','Handler_write','Handler_update','Handler_delete','Handler_read_key','Handler_read_next','Innodb_data_fsyncs'"
dbstatus() { mysql -uroot -N -B -e "SHOW GLOBAL STATUS WHERE Variable_name IN ($counters)" 2> /dev/null || true; }
dbbefore=$(dbstatus)
start=$(date +%s.%N)
# The bench's own CPU comes from its JSON (process_cpu_s); its exit status
# is reported, not fatal, so a run that lost tasks still shows its cost.
set +e
${BENCH_BIN:-bin/delaybridge} bench "$@" > "$out" &
bench=$!
echo "delaybridge-bench $bench" >> "$watch"
wait "$bench"
status=$?
set -e
elapsed=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
json=$(tail -1 "$out")
cat "$out"
rm -f "$out"
# With --floor the JSON ends with the floor's run under "floor": read the
# broker run's fields before it and the floor's after it.
main=${json%%,\"floor\":*}
floor=""
[[ $json == *',"floor":{'* ]] && floor=${json#*,\"floor\":}
field() { echo "$1" | sed -n "s/.*\"$2\":\([0-9.]*\).*/\1/p"; }
handled=$(field "$main" handled)
handled=${handled:-$(field "$main" scheduled)}
self=$(field "$main" process_cpu_s)
# Both runs' CPU is counted from here on, so per task means per task of
# either run.
if [ -z "$handled" ]; then
	# No summary (the bench failed before its JSON): nothing to share out.
	kill "$sampler" 2> /dev/null || true
	echo "bench-cpu: no JSON summary from the bench (add --json?); CPU per task not computed" >&2
	exit $((status ? status : 1))
fi
tasks=$handled
if [ -n "$floor" ]; then
	tasks=$((handled + $(field "$floor" handled)))
	echo "with --floor the CPU below is both runs', the floor's and the broker's: per task is per task of either"
fi
printf '\n%-18s %10s %14s\n' process "cpu s" "µs per task"
rows=""
for name in "${!before[@]}"; do
	read -r pid t0 <<< "${before[$name]}"
	[ -r "/proc/$pid/stat" ] || continue
	rows+="$name $(awk -v a="$t0" -v b="$(ticks "$pid")" -v hz="$HZ" 'BEGIN { print (b - a) / hz }')"$'\n'
done
[ -n "$self" ] && rows+="delaybridge-bench $self"$'\n'
printf '%s' "$rows" | awk -v n="$tasks" -v cores="$(nproc)" -v secs="$elapsed" '
	{ printf "%-18s %10.2f %14.0f\n", $1, $2, $2 * 1e6 / n; total += $2 }
	END {
		printf "%-18s %10.2f %14.0f\n", "total", total, total * 1e6 / n
		printf "tasks %d in %ss; at 5,000 tasks/s this work needs %.2f cores, the box has %d: it carries at most %.0f tasks/s\n", n, secs, total / n * 5000, cores, cores * n / total
	}'
if [ -n "$dbbefore" ]; then
	printf '\n%-22s %14s\n' "MariaDB counter" "per task"
	awk -v n="$tasks" 'NR == FNR { b[$1] = $2; next } ($1 in b) { printf "%-22s %14.2f\n", $1, ($2 - b[$1]) / n }' \
		<(echo "$dbbefore") <(dbstatus)
fi
# How busy the whole box was in the due window (from the first task due to
# the last handled; a relay-only run has none). Near 100 % means lateness
# was the cores' limit: the work due in the window waited for a core.
kill "$sampler" 2> /dev/null || true
window() { # label json
	local first last n
	first=$(field "$2" first_due_unix_ms)
	last=$(field "$2" last_handled_unix_ms)
	n=$(field "$2" handled)
	[ -n "$first" ] && [ -n "$last" ] && [ "$last" -gt "$first" ] || return 0
	# /proc/stat: cpu user nice system idle iowait irq softirq steal ...
	# Steal is time a virtual machine's cores were given to another guest:
	# counted as busy (the work waited all the same) and shown on its own,
	# as a run with much of it was slowed by the host, not by its own work.
	awk -v label="$1" -v a="$first" -v b="$last" -v cores="$(nproc)" -v hz="$HZ" -v n="$n" '
		{
			t = $1 / 1000; busy = $3 + $4 + $5 + $8 + $9 + $10; all = busy + $6 + $7; steal = $10
			delete cur; nn = 0
			for (i = 1; i <= NF; i++) if ($i == "|") break
			for (i++; i <= NF; i++) { split($i, kv, "="); cur[kv[1]] = kv[2]; names[++nn] = kv[1] }
		}
		t >= a && !seen {
			seen = 1; t0 = t; b0 = busy; a0 = all; s0 = steal
			for (i = 1; i <= nn; i++) { p0[names[i]] = cur[names[i]]; order[++k] = names[i] }
		}
		seen && t <= b {
			t1 = t; b1 = busy; a1 = all; s1 = steal
			for (p in cur) if (p in p0) p1[p] = cur[p]
		}
		END {
			if (!seen || t1 <= t0 || a1 <= a0) { print label ": too short to sample"; exit }
			f = (b1 - b0) / (a1 - a0)
			scale = 1e6 / hz / n * (b - a) / (t1 - t0) # ticks to µs a task, over the whole window
			printf "%s %.1fs (first task due to last handled): the box was %.0f%% busy (%.2f of %d cores, steal %.0f%%), %.0f µs of CPU per task", label, (b - a) / 1000, f * 100, f * cores, cores, (s1 - s0) / (a1 - a0) * 100, (b1 - b0 - (s1 - s0)) * scale
			sep = ": "
			for (i = 1; i <= k; i++) {
				p = order[i]
				if (p in p1) { printf "%s%s %.0f", sep, p, (p1[p] - p0[p]) * scale; sep = ", " }
			}
			print ""
		}' "$samples"
}
[ -n "$floor" ] && window "floor's due window" "$floor"
window "due window" "$main"
exit $status
