#!/usr/bin/env bash
# Makes Redis and Postgres reachable for pelguard's tests and drill.
#
#   scripts/services.sh env         ensure both answer; print the exports (leaves
#                                   anything it started running: `stop` ends it)
#   scripts/services.sh run CMD...  ensure both answer, run CMD with REDIS_URL and
#                                   DATABASE_URL exported, stop what it started
#   scripts/services.sh stop        stop services an earlier `env` or `cluster` started
#   scripts/services.sh cluster     start a local Redis Cluster (3 masters, 3 replicas,
#                                   AOF everysec, node timeout 2s) on free loopback
#                                   ports; print its REDIS_URL (redis+cluster://…)
#
# It uses REDIS_URL / DATABASE_URL when they answer, else the usual local
# addresses (127.0.0.1:6379, postgres@127.0.0.1:5432), else it starts a
# throwaway redis-server and Postgres (initdb) on free loopback ports in a temp
# dir, installing Debian's redis-server / postgresql packages first if the
# binaries are missing.
set -euo pipefail

STATE_FILE="${PELGUARD_SERVICES_STATE:-$(cd "$(dirname "$0")/.." && pwd)/.services/state}"
DEFAULT_REDIS_URL="redis://127.0.0.1:6379/0"
DEFAULT_DATABASE_URL="postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

log() { printf 'services: %s\n' "$*" >&2; }
die() { printf 'services: error: %s\n' "$*" >&2; exit 1; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    die "need root to run: $* (install it yourself, or set REDIS_URL / DATABASE_URL)"; fi
}

apt_updated=0
apt_install() {
  command -v apt-get >/dev/null || die "cannot install $*: no apt-get; install it or set REDIS_URL / DATABASE_URL"
  log "installing $* from Debian's packages"
  if [ "$apt_updated" = 0 ]; then as_root apt-get update -qq >&2; apt_updated=1; fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
}

free_port() {
  local p
  for _ in $(seq 1 50); do
    p=$(( 20000 + RANDOM % 20000 ))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return; fi
  done
  die "no free port found"
}

redis_answers() {
  command -v redis-cli >/dev/null || return 1
  [ "$(timeout 3 redis-cli -u "$1" ping 2>/dev/null)" = PONG ]
}

pg_answers() {
  command -v psql >/dev/null || return 1
  timeout 5 psql "$1" -Atqc 'select 1' >/dev/null 2>&1
}

STARTED_DIR=""
start_dir() {
  if [ -z "$STARTED_DIR" ]; then STARTED_DIR=$(mktemp -d /tmp/pelguard-services.XXXXXX); chmod 755 "$STARTED_DIR"; fi
}

ensure_redis() {
  if [ -n "${REDIS_URL:-}" ]; then
    redis_answers "$REDIS_URL" && return
    log "REDIS_URL does not answer; starting a throwaway Redis instead"
  elif redis_answers "$DEFAULT_REDIS_URL"; then
    REDIS_URL=$DEFAULT_REDIS_URL; return
  fi
  command -v redis-server >/dev/null && command -v redis-cli >/dev/null || apt_install redis-server
  start_dir
  local port; port=$(free_port)
  mkdir -p "$STARTED_DIR/redis"
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
    --dir "$STARTED_DIR/redis" --pidfile "$STARTED_DIR/redis/redis.pid" --logfile "$STARTED_DIR/redis/redis.log" >&2
  REDIS_URL="redis://127.0.0.1:$port/0"
  for _ in $(seq 1 100); do redis_answers "$REDIS_URL" && break; sleep 0.1; done
  redis_answers "$REDIS_URL" || die "throwaway Redis did not start; see $STARTED_DIR/redis/redis.log"
  log "started Redis on 127.0.0.1:$port ($STARTED_DIR/redis)"
}

# start_cluster: six cluster-enabled redis-servers joined by redis-cli
# --cluster create with one replica per master, in $STARTED_DIR/cluster.
# The bus port of each node is its port + 10000, so both must be free; ports
# 20000-22699 keep both below Linux's ephemeral range (32768+), where an
# outgoing connection could hold a port that nothing listens on.
cluster_port() {
  local p
  for _ in $(seq 1 50); do
    p=$(( 20000 + RANDOM % 2700 ))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && ! (exec 3<>"/dev/tcp/127.0.0.1/$((p + 10000))") 2>/dev/null; then
      echo "$p"; return
    fi
  done
  die "no free port pair for a cluster node"
}

start_cluster() {
  command -v redis-server >/dev/null && command -v redis-cli >/dev/null || apt_install redis-server
  start_dir
  local addrs=() port node
  for _ in 1 2 3 4 5 6; do
    port=$(cluster_port)
    node="$STARTED_DIR/cluster/$port"
    mkdir -p "$node"
    redis-server --port "$port" --bind 127.0.0.1 --dir "$node" --daemonize yes \
      --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
      --appendonly yes --appendfsync everysec --save "" \
      --pidfile "$node/redis.pid" --logfile "$node/redis.log" >&2
    addrs+=("127.0.0.1:$port")
  done
  for a in "${addrs[@]}"; do
    for _ in $(seq 1 100); do redis_answers "redis://$a" && break; sleep 0.1; done
    redis_answers "redis://$a" || die "cluster node $a did not start; see $STARTED_DIR/cluster/${a##*:}/redis.log"
  done
  redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes >"$STARTED_DIR/cluster/create.log" 2>&1 \
    || die "redis-cli --cluster create failed; see $STARTED_DIR/cluster/create.log"
  local ok=0
  for _ in $(seq 1 200); do
    ok=1
    for a in "${addrs[@]}"; do
      redis-cli -h "${a%:*}" -p "${a##*:}" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || { ok=0; break; }
    done
    [ "$ok" = 1 ] && break
    sleep 0.1
  done
  [ "$ok" = 1 ] || die "the cluster did not reach cluster_state:ok; see $STARTED_DIR/cluster/*/redis.log"
  REDIS_URL="redis+cluster://$(IFS=,; echo "${addrs[*]}")/"
  log "started a Redis Cluster (3 masters, 3 replicas) in $STARTED_DIR/cluster: ${addrs[*]}"
}

pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }

ensure_pg() {
  if [ -n "${DATABASE_URL:-}" ]; then
    pg_answers "$DATABASE_URL" && return
    log "DATABASE_URL does not answer; starting a throwaway Postgres instead"
  elif pg_answers "$DEFAULT_DATABASE_URL"; then
    DATABASE_URL=$DEFAULT_DATABASE_URL; return
  fi
  { [ -n "$(pg_bin)" ] && command -v psql >/dev/null; } || apt_install postgresql postgresql-client
  local bin; bin=$(pg_bin)
  [ -x "$bin/initdb" ] || die "initdb not found under /usr/lib/postgresql/*/bin"
  start_dir
  local port; port=$(free_port)
  local dir="$STARTED_DIR/pg"
  mkdir -p "$dir"
  # initdb refuses to run as root: run the server as the postgres user the
  # package created (or a dedicated one).
  local run=()
  if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
    chown -R postgres "$dir"
    run=(runuser -u postgres --)
  fi
  "${run[@]}" "$bin/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 >"$dir/initdb.log" 2>&1 \
    || die "initdb failed; see $dir/initdb.log"
  "${run[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 \
    -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=300" start >&2 \
    || die "Postgres did not start; see $dir/postgres.log"
  DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
  pg_answers "$DATABASE_URL" || die "throwaway Postgres does not answer; see $dir/postgres.log"
  log "started Postgres on 127.0.0.1:$port ($dir)"
}

stop_dir() {
  local dir=$1
  [ -d "$dir" ] || return 0
  if [ -f "$dir/redis/redis.pid" ]; then kill "$(cat "$dir/redis/redis.pid")" 2>/dev/null || true; fi
  local pidfile
  for pidfile in "$dir"/cluster/*/redis.pid; do
    [ -f "$pidfile" ] && { kill "$(cat "$pidfile")" 2>/dev/null || true; }
  done
  if [ -d "$dir/pg/data" ]; then
    local bin; bin=$(pg_bin)
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$bin/pg_ctl" -D "$dir/pg/data" -m fast -w stop >/dev/null 2>&1 || true
    else "$bin/pg_ctl" -D "$dir/pg/data" -m fast -w stop >/dev/null 2>&1 || true; fi
  fi
  rm -rf "$dir"
}

cmd=${1:-env}
[ $# -gt 0 ] && shift
case "$cmd" in
  env)
    ensure_redis; ensure_pg
    if [ -n "$STARTED_DIR" ]; then mkdir -p "$(dirname "$STATE_FILE")"; echo "$STARTED_DIR" >>"$STATE_FILE"; fi
    echo "export REDIS_URL='$REDIS_URL'"
    echo "export DATABASE_URL='$DATABASE_URL'"
    log "Redis and Postgres answer. Run: eval \"\$(scripts/services.sh env)\""
    ;;
  run)
    [ $# -gt 0 ] || die "usage: scripts/services.sh run CMD..."
    ensure_redis; ensure_pg
    export REDIS_URL DATABASE_URL
    if [ -n "$STARTED_DIR" ]; then trap 'stop_dir "$STARTED_DIR"' EXIT; fi
    status=0; "$@" || status=$?
    exit "$status"
    ;;
  cluster)
    start_cluster
    mkdir -p "$(dirname "$STATE_FILE")"; echo "$STARTED_DIR" >>"$STATE_FILE"
    echo "export REDIS_URL='$REDIS_URL'"
    log "stop it with: scripts/services.sh stop (or make services-stop)"
    ;;
  stop)
    if [ -f "$STATE_FILE" ]; then
      while read -r d; do stop_dir "$d"; log "stopped services in $d"; done <"$STATE_FILE"
      rm -f "$STATE_FILE"
    else log "nothing to stop"; fi
    ;;
  -h|--help|help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//' ;;
  *) die "unknown command $cmd (want env, run, cluster or stop)";;
esac
