#!/usr/bin/env bash
# A lecture hall on one machine: N `streamlit run app.py` replicas behind HAProxy (deploy/haproxy.cfg).
#
#   deploy/hall.sh up N      start N replicas and the proxy; students open http://127.0.0.1:$HALL_PORT/
#   deploy/hall.sh up N --redis   the same, and a redis-server beside them for the live class's rooms (/class):
#                            every replica gets ATTENTION_LAB_CLASS_STORE=redis://127.0.0.1:$HALL_REDIS_PORT/0
#   deploy/hall.sh down      stop the proxy and every replica this hall started
#   deploy/hall.sh status    replicas and proxy, with HAProxy's view (UP/DOWN, sessions)
#
# Environment (all optional):
#   HALL_PORT     the proxy's port (default 8501); replica i (1..N) listens on HALL_PORT + 10 + i
#   HALL_RUN      run directory: pid files, logs, the generated config (default /tmp/attention-lab-hall-$HALL_PORT)
#   HALL_PYTHON   the Python with the app installed (default .venv/bin/python, else python3)
#   HALL_THREADS  torch threads per replica (default: CPU cores / N, at least 1: replicas must not
#                 fight over the same cores)
#   HALL_ARGS     extra `streamlit run` options for every replica (e.g. --server.disconnectedSessionTTL 2)
#   HALL_REDIS    1: as `--redis`
#   HALL_REDIS_PORT  the redis-server's port with --redis (default HALL_PORT + 9, below the replicas' ports)
# Without --redis the replicas share the rooms through SQLite (a file in the lab's cache folder): enough on one
# machine. Redis is for replicas on several machines (point theirs at one redis-server), or a shared disk you
# would rather not lock; the redis-server keeps rooms in memory only (no dump file), and rooms expire anyway.
# Everything listens on 127.0.0.1 only; a real hall changes the proxy's `bind` line.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
export HALL_PORT="${HALL_PORT:-8501}"
export HALL_RUN="${HALL_RUN:-/tmp/attention-lab-hall-$HALL_PORT}"
PY="${HALL_PYTHON:-}"
if [ -z "$PY" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY="python3"; fi
fi

die() { echo "hall: $*" >&2; exit 1; }

haproxy_bin() {
    command -v haproxy 2>/dev/null || { [ -x /usr/sbin/haproxy ] && echo /usr/sbin/haproxy; } || true
}

ensure_haproxy() {
    [ -n "$(haproxy_bin)" ] && return 0
    echo "hall: HAProxy is missing; installing Debian's package with apt-get"
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    DEBIAN_FRONTEND=noninteractive $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends haproxy >/dev/null
    [ -n "$(haproxy_bin)" ] || die "apt-get installed no haproxy binary"
}

# wait_health PORT SECONDS [PIDFILE]: until /_stcore/health on 127.0.0.1:PORT says ok (bounded;
# gives up at once when the process of PIDFILE has exited).
wait_health() {
    local port="$1" deadline=$((SECONDS + $2))
    while [ "$SECONDS" -lt "$deadline" ]; do
        if [ -n "${3:-}" ] && ! alive "$3"; then return 1; fi
        if [ "$(curl -s -m 2 "http://127.0.0.1:$port/_stcore/health" 2>/dev/null || true)" = "ok" ]; then
            return 0
        fi
        sleep 0.3
    done
    return 1
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

ensure_redis() {
    command -v redis-server >/dev/null && return 0
    echo "hall: redis-server is missing; installing Debian's package with apt-get"
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    DEBIAN_FRONTEND=noninteractive $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends redis-server >/dev/null
    command -v redis-server >/dev/null || die "apt-get installed no redis-server binary"
}

# start_redis PORT: a redis-server on 127.0.0.1:PORT in its own process group (pid in redis.pid), memory only;
# returns once it answers PING (bounded).
start_redis() {
    local port="$1"
    ensure_redis
    setsid redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no --dir "$HALL_RUN" \
        >"$HALL_RUN/redis.log" 2>&1 </dev/null &
    echo $! >"$HALL_RUN/redis.pid"
    local deadline=$((SECONDS + 20))
    while [ "$SECONDS" -lt "$deadline" ]; do
        alive "$HALL_RUN/redis.pid" || break
        # PING in the protocol's inline form, over bash's /dev/tcp: no redis-cli needed
        if { exec 3<>"/dev/tcp/127.0.0.1/$port"; } 2>/dev/null; then
            printf 'PING\r\n' >&3
            local reply=""
            read -r -t 2 reply <&3 || true
            exec 3>&- 3<&-
            [ "${reply%$'\r'}" = "+PONG" ] && return 0
        fi
        sleep 0.2
    done
    tail -20 "$HALL_RUN/redis.log" >&2
    return 1
}

up() {
    local n="${1:-}" redis="${HALL_REDIS:-0}"
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "usage: $0 up N [--redis]   (N = number of replicas, 1 or more)"
    case "${2:-}" in
        --redis) redis=1 ;;
        "") ;;
        *) die "usage: $0 up N [--redis]   (unknown option ${2})" ;;
    esac
    [ "$n" -le 79 ] || die "at most 79 replicas (ports HALL_PORT+11 .. HALL_PORT+89)"
    if alive "$HALL_RUN/haproxy.pid" || alive "$HALL_RUN/redis.pid" || compgen -G "$HALL_RUN/replica-*.pid" >/dev/null; then
        die "a hall is already running in $HALL_RUN (HALL_PORT=$HALL_PORT); run '$0 down' first"
    fi
    ensure_haproxy
    mkdir -p "$HALL_RUN"
    chmod 700 "$HALL_RUN"
    # One cookie secret for all replicas: a cookie one replica signed must verify on the replica a
    # student lands on after a failover. Kept in the run directory (mode 600), new for every hall.
    local secret
    secret="$("$PY" -c 'import secrets; print(secrets.token_hex(32))')"
    (umask 077 && echo "$secret" >"$HALL_RUN/cookie_secret")
    local cores threads
    cores="$(nproc)"
    threads="${HALL_THREADS:-$(( cores / n > 0 ? cores / n : 1 ))}"
    # The generated config: the documented file plus one server line per replica.
    cp "$ROOT/deploy/haproxy.cfg" "$HALL_RUN/haproxy.cfg"
    for i in $(seq 1 "$n"); do
        echo "    server r$i 127.0.0.1:$((HALL_PORT + 10 + i)) cookie r$i" >>"$HALL_RUN/haproxy.cfg"
    done
    "$(haproxy_bin)" -c -q -f "$HALL_RUN/haproxy.cfg" || die "HAProxy refuses $HALL_RUN/haproxy.cfg"
    local store="${ATTENTION_LAB_CLASS_STORE:-}"
    if [ "$redis" = 1 ]; then
        local rport="${HALL_REDIS_PORT:-$((HALL_PORT + 9))}"
        start_redis "$rport" || { down; die "redis-server did not answer on port $rport (log above)"; }
        store="redis://127.0.0.1:$rport/0"  # one store for every replica: a room is the same room on each
    fi
    cd "$ROOT"  # streamlit reads .streamlit/config.toml from the working directory
    for i in $(seq 1 "$n"); do
        local port=$((HALL_PORT + 10 + i))
        # setsid: each replica leads its own process group, so `down` (and a test that kills one
        # replica) reaches all of its processes and nothing else. HALL_ARGS is split on purpose.
        # shellcheck disable=SC2086
        # (Streamlit takes the cookie secret from the environment only, never from the command line.)
        OMP_NUM_THREADS="$threads" STREAMLIT_SERVER_COOKIE_SECRET="$secret" ATTENTION_LAB_CLASS_STORE="$store" \
            setsid "$PY" -m streamlit run app.py \
            --server.headless true --server.address 127.0.0.1 --server.port "$port" \
            --server.fileWatcherType none --browser.gatherUsageStats false ${HALL_ARGS:-} \
            >"$HALL_RUN/replica-$i.log" 2>&1 </dev/null &
        echo $! >"$HALL_RUN/replica-$i.pid"
    done
    for i in $(seq 1 "$n"); do
        wait_health $((HALL_PORT + 10 + i)) 120 "$HALL_RUN/replica-$i.pid" || { tail -20 "$HALL_RUN/replica-$i.log" >&2; down;
            die "replica $i did not answer /_stcore/health within 120 s (log above)"; }
    done
    "$(haproxy_bin)" -D -f "$HALL_RUN/haproxy.cfg" -p "$HALL_RUN/haproxy.pid" || { down; die "HAProxy did not start"; }
    wait_health "$HALL_PORT" 20 || { down; die "the proxy on port $HALL_PORT does not answer"; }
    echo "hall: $n replica(s) (ports $((HALL_PORT + 11))-$((HALL_PORT + 10 + n)), $threads torch thread(s) each)" \
         "behind HAProxy: http://127.0.0.1:$HALL_PORT/   (run dir $HALL_RUN)"
    if [ "$redis" = 1 ]; then echo "hall: the live class's rooms in $store"; fi
}

# stop PIDFILE: SIGTERM the process group it names, SIGKILL after 10 s (bounded), remove the file.
stop() {
    local f="$1" pid
    [ -f "$f" ] || return 0
    pid="$(cat "$f")"
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$f"
}

down() {
    [ -d "$HALL_RUN" ] || { echo "hall: nothing running in $HALL_RUN"; return 0; }
    # HAProxy's pid file names the daemon itself (not a group leader): plain kill.
    if [ -f "$HALL_RUN/haproxy.pid" ]; then
        kill -TERM "$(cat "$HALL_RUN/haproxy.pid")" 2>/dev/null || true
        rm -f "$HALL_RUN/haproxy.pid"
    fi
    local f
    for f in "$HALL_RUN"/replica-*.pid; do [ -e "$f" ] && stop "$f"; done
    stop "$HALL_RUN/redis.pid"  # after the replicas: none is left to write a room into it
    rm -f "$HALL_RUN/cookie_secret" "$HALL_RUN/haproxy.sock"
    echo "hall: stopped (logs kept in $HALL_RUN)"
}

status() {
    local f i
    for f in "$HALL_RUN"/replica-*.pid; do
        [ -e "$f" ] || { echo "hall: no replicas in $HALL_RUN"; break; }
        i="${f##*/replica-}"; i="${i%.pid}"
        if alive "$f"; then echo "replica $i: pid $(cat "$f"), port $((HALL_PORT + 10 + i))"
        else echo "replica $i: not running"; fi
    done
    if alive "$HALL_RUN/redis.pid"; then echo "redis-server: pid $(cat "$HALL_RUN/redis.pid")"; fi
    if alive "$HALL_RUN/haproxy.pid"; then
        echo "haproxy: pid $(cat "$HALL_RUN/haproxy.pid"), http://127.0.0.1:$HALL_PORT/"
        # pxname,svname,...,scur(5),...,status(18): current sessions and state per replica
        "$PY" - "$HALL_RUN/haproxy.sock" <<'EOF'
import socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(b"show stat\n")
data = b"".join(iter(lambda: s.recv(65536), b"")).decode()
for row in data.splitlines()[1:]:
    f = row.split(",")
    if len(f) > 17 and f[0] == "replicas" and f[1] not in ("FRONTEND", "BACKEND"):
        print(f"  {f[1]}: {f[17]}, {f[4]} open connection(s)")
EOF
    else
        echo "haproxy: not running"
    fi
}

case "${1:-}" in
    up) up "${2:-}" "${3:-}" ;;
    down) down ;;
    status) status ;;
    *) die "usage: $0 up N [--redis] | down | status" ;;
esac
