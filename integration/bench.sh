#!/bin/bash
# Runs flowgate's benchmarks and prints the median of each metric over the
# runs: the end-to-end ones in this folder (spliced TLS throughput,
# connect+handshake latency, round trips on an established stream and DNS
# latency, each through flowgate, directly and through a relay that
# decides nothing, in the same run, with flowgate in a process of its own
# and in the test process) and the component ones the README quotes
# (matching and loading 100k rules, compiling and applying a ruleset,
# learned-set updates, upstream dials, sandbox creation). Needs root (the
# benchmarks make network namespaces and nftables rules, all removed at
# the end).
#
#   integration/bench.sh                     # 5 runs of each
#   COUNT=10 BENCHTIME=5x integration/bench.sh
#   ONLY=integration integration/bench.sh    # only the end-to-end ones
#
# benchstat (golang.org/x/perf/cmd/benchstat), when installed, also
# summarises the runs.
set -euo pipefail

if [ "$(id -u)" != 0 ]; then
	echo "bench.sh: needs root (network namespaces, nftables)" >&2
	exit 2
fi
cd "$(dirname "$0")/.."
count=${COUNT:-5}
benchtime=${BENCHTIME:-3x}
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# package, benchmarks, -benchtime (component benchmarks run by time).
suites=(
	"./integration|.*|$benchtime"
	"./gate|Match100k|Compile100k|1s"
	"./policyload|LoadPolicy100k|1s"
	"./gate/nft|CompileApply|LearnedAdd1000|1s"
	"./gate/dns|DNSAddedLatency|1s"
	"./gate/sni|ConnectHandshake|1s"
	"./gate/netnsx|PoolDial|DoDial|1s"
	"./runtime|CreateClose|1s"
)
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) CPUs)"
for s in "${suites[@]}"; do
	pkg=${s%%|*}
	rest=${s#*|}
	bt=${rest##*|}
	re=${rest%|*}
	if [ -n "${ONLY:-}" ] && [ "./$ONLY" != "$pkg" ]; then
		continue
	fi
	go test -run '^$' -bench "^Benchmark($re)\$|^Benchmark($re)/" -count "$count" -benchtime "$bt" "$pkg" | tee -a "$out"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo

# Each result line is: name, iterations, then value/unit pairs.
awk '
/^Benchmark/ {
	name = $1; sub(/-[0-9]+$/, "", name)
	if (!(name in seen)) { seen[name] = 1; names[++nn] = name }
	for (i = 3; i + 1 <= NF; i += 2) {
		key = name SUBSEP $(i + 1)
		if (!(key in nv)) units[name, ++nu[name]] = $(i + 1)
		vals[key, ++nv[key]] = $i
	}
}
function median(key,    n, i, j, t, a) {
	n = nv[key]
	for (i = 1; i <= n; i++) a[i] = vals[key, i] + 0
	for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
END {
	print "medians over the runs:"
	for (k = 1; k <= nn; k++) {
		name = names[k]
		line = sprintf("  %-38s", name)
		for (u = 1; u <= nu[name]; u++) {
			unit = units[name, u]
			line = line sprintf("  %s %.4g", unit, median(name SUBSEP unit))
		}
		print line
	}
	print ""
	print "targets: TLSThroughput ratio >= 0.90; ConnectHandshake added-p50-us < 200; DNS added-p50-us < 100 (issue 4,"
	print "  end to end: the /process rows, flowgate as deployed; /inprocess shares a runtime with the simulated servers;"
	print "  relay-* is barerelay, a relay that decides nothing, in a process of its own: the floor on this machine);"
	print "  Match100k < 1000 ns/op, Compile100k < 200 ms (issue 2); CompileApply p50 < 20 ms, LearnedAdd1000 < 10 ms (issue 3)"
}' "$out"

if command -v benchstat >/dev/null 2>&1; then
	echo
	benchstat "$out"
fi
