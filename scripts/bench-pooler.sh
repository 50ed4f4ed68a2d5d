#!/usr/bin/env bash
# Measures the consumer's throughput by connection and query mode
# (BenchmarkConsumerPooler in ./consumer): straight to Postgres in pgx's
# cache_statement, pelguard's cache_describe and exec, and through PgBouncer
# in transaction mode with cache_describe. Prints each variant's median
# events/s over ROUNDS rounds and the ratios the connection-pooler page
# reports, all from this one run.
#
#   scripts/bench-pooler.sh [ROUNDS [OPS]]   (default 5 rounds of 1 op: 2,000 events per op)
#
# Each variant runs in a process of its own and the order rotates every
# round, so a change of load on a shared machine falls on every variant
# alike instead of on whichever ran last (`go test -count N` runs one
# variant N times in a row). Needs pgbouncer (apt-get install -y pgbouncer).
set -euo pipefail
rounds="${1:-5}"
ops="${2:-1}"
root="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
go test -c -o "$tmp/consumer.test" "$root/consumer"
variants=(direct/cache_statement direct/cache_describe direct/exec pgbouncer/cache_describe)
cd "$root/consumer"
for r in $(seq 1 "$rounds"); do
  for k in 0 1 2 3; do
    v="${variants[$(( (r + k) % 4 ))]}"
    line="$("$root/scripts/services.sh" run "$tmp/consumer.test" -test.run '^$' \
      -test.bench "BenchmarkConsumerPooler/^${v}\$" -test.benchtime "${ops}x" -test.count 1 2>&1 | grep '^BenchmarkConsumerPooler' || true)"
    if [ -z "$line" ]; then
      echo "bench-pooler: $v produced no result (is pgbouncer installed?)" >&2
      exit 1
    fi
    echo "round $r: $line"
    echo "$v $(awk '{for (i = 1; i < NF; i++) if ($(i+1) == "events/s") print $i}' <<<"$line")" >>"$tmp/results"
  done
done
median() { awk -v v="$1" '$1 == v {print $2}' "$tmp/results" | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
echo
for v in "${variants[@]}"; do
  printf '%-26s median %8.1f events/s\n' "$v" "$(median "$v")"
done
st="$(median direct/cache_statement)" de="$(median direct/cache_describe)" ex="$(median direct/exec)" pb="$(median pgbouncer/cache_describe)"
awk -v st="$st" -v de="$de" -v ex="$ex" -v pb="$pb" 'BEGIN {
  printf "pooler / direct (both cache_describe):       %.2f\n", pb / de
  printf "cache_describe / cache_statement (direct):   %.2f\n", de / st
  printf "exec / cache_statement (direct):             %.2f\n", ex / st
  printf "pooler cache_describe / direct cache_statement: %.2f\n", pb / st
}'
