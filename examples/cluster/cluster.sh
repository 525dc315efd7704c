#!/usr/bin/env bash
# Start, stop and inspect an 8-node rocket cluster on 127.0.0.1: three nameservers, three storage nodes
# and two brokers, each a `rocket run` process with its own config (beside this script), data directory,
# log and pid file under one base directory. See README.md beside this script.
#
#   cluster.sh start  [BASE_DIR]   start all nodes in the background, wait until each is ready, show status
#   cluster.sh stop   [BASE_DIR]   SIGTERM every node, wait, SIGKILL what is left
#   cluster.sh status [BASE_DIR]   which nodes run, then `rocket cluster status`
#
# BASE_DIR defaults to ./rocket-cluster. Environment:
#   PORT_BASE        node N listens on PORT_BASE+N (TCP); broker N on PORT_BASE+N+10 (HTTP/2). Default 9100;
#                    start records it in BASE_DIR, and stop and status read it from there.
#   ROCKET_BIN       the command that runs rocket (default: `rocket` if on PATH, else `python3 -m rocket`)
#   START_TIMEOUT_S  how long start waits for every node to be ready (default 60)
#   STOP_TIMEOUT_S   how long stop waits after SIGTERM before SIGKILL (default 20; nodes drain for 10)
# BASE_DIR/NODE/node.env, if present: KEY=VALUE lines added to that node's environment alone.
set -euo pipefail

CONFIG_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NODES=(ns1 ns2 ns3 storage1 storage2 storage3 broker1 broker2)
START_TIMEOUT_S=${START_TIMEOUT_S:-60}
STOP_TIMEOUT_S=${STOP_TIMEOUT_S:-20}

if [[ -n "${ROCKET_BIN:-}" ]]; then
    read -r -a ROCKET_CMD <<<"$ROCKET_BIN"
elif command -v rocket >/dev/null 2>&1; then
    ROCKET_CMD=(rocket)
else
    ROCKET_CMD=(python3 -m rocket)
fi

usage() {
    echo "usage: $(basename "$0") start|stop|status [BASE_DIR]   (default BASE_DIR: ./rocket-cluster)" >&2
    exit 2
}

die() {
    echo "cluster.sh: $*" >&2
    exit 1
}

# node_id NAME: the node id, which is also the node's port offset from PORT_BASE.
node_id() {
    case "$1" in
        ns1) echo 1 ;;
        ns2) echo 2 ;;
        ns3) echo 3 ;;
        storage1) echo 11 ;;
        storage2) echo 12 ;;
        storage3) echo 13 ;;
        broker1) echo 21 ;;
        broker2) echo 22 ;;
        *) die "unknown node $1" ;;
    esac
}

tcp_address() { echo "127.0.0.1:$((PORT_BASE + $(node_id "$1")))"; }

http2_address() {
    case "$1" in
        broker*) echo "127.0.0.1:$((PORT_BASE + $(node_id "$1") + 10))" ;;
        *) echo off ;;
    esac
}

nameservers() { echo "1@$(tcp_address ns1),2@$(tcp_address ns2),3@$(tcp_address ns3)"; }

# set_base_dir DIR CREATE: BASE_DIR as an absolute path (the nodes' command lines name it).
set_base_dir() {
    local base=${1:-./rocket-cluster}
    if [[ "$2" == yes ]]; then
        mkdir -p "$base"
    fi
    [[ -d "$base" ]] || die "no such directory: $base (nothing was started there)"
    BASE_DIR=$(cd "$base" && pwd)
}

# set_port_base FROM_RECORD: PORT_BASE from the environment, else (for stop and status) as start recorded it.
set_port_base() {
    if [[ -z "${PORT_BASE:-}" && "$1" == yes && -f "$BASE_DIR/port_base" ]]; then
        PORT_BASE=$(<"$BASE_DIR/port_base")
    fi
    PORT_BASE=${PORT_BASE:-9100}
    if ! [[ "$PORT_BASE" =~ ^[0-9]+$ ]] || ((PORT_BASE < 1 || PORT_BASE + 32 > 65535)); then
        die "PORT_BASE must be an integer from 1 to 65503, got '$PORT_BASE'"
    fi
}

pid_file() { echo "$BASE_DIR/$1/node.pid"; }
log_file() { echo "$BASE_DIR/$1/node.log"; }
data_dir() { echo "$BASE_DIR/$1/data"; }

# alive PID NAME: the process exists, is not a zombie, and is this base dir's node NAME (not a reused pid).
alive() {
    local pid=$1 name=$2 state
    kill -0 "$pid" 2>/dev/null || return 1
    if [[ -r "/proc/$pid/stat" ]]; then
        state=$(sed -e 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1) || return 1
        [[ "$state" != Z ]] || return 1
        tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "--data-dir $(data_dir "$name") " || return 1
    fi
}

# running_pid NAME: print the node's pid if it runs: from its pid file, or else (the file was lost) found
# by the data directory on its command line.
running_pid() {
    local file pid pattern
    file=$(pid_file "$1")
    if [[ -f "$file" ]]; then
        pid=$(<"$file")
        if [[ "$pid" =~ ^[0-9]+$ ]] && alive "$pid" "$1"; then
            echo "$pid"
            return 0
        fi
    fi
    command -v pgrep >/dev/null 2>&1 || return 1
    pattern=$(printf '%s' "--data-dir $(data_dir "$1") " | sed -e 's/[][\\.^$*+?(){}|]/\\&/g')
    for pid in $(pgrep -f -- "$pattern" || true); do
        if alive "$pid" "$1"; then
            echo "$pid"
            return 0
        fi
    done
    return 1
}

start_node() {
    local name=$1 log node_env=()
    log=$(log_file "$name")
    mkdir -p "$(data_dir "$name")"
    if [[ -f "$log" ]]; then
        mv -f "$log" "$log.1"
    fi
    # Extra environment for this node alone (benchmarks/faults.py prepare writes ROCKET_ADVERTISE there).
    if [[ -f "$BASE_DIR/$name/node.env" ]]; then
        mapfile -t node_env < <(grep -E '^[A-Za-z_][A-Za-z0-9_]*=' "$BASE_DIR/$name/node.env")
    fi
    # One object store for the whole cluster, as S3 would be: offloaded pieces any leader can read, every node's
    # telemetry, and the models the nameservers place queues by (unless the environment names another).
    env ROCKET_TIER_DIRECTORY="${ROCKET_TIER_DIRECTORY:-$BASE_DIR/tier}" "${node_env[@]+"${node_env[@]}"}" \
        "${ROCKET_CMD[@]}" run --config "$CONFIG_DIR/$name.toml" \
        --data-dir "$(data_dir "$name")" \
        --listen "$(tcp_address "$name")" \
        --http2-listen "$(http2_address "$name")" \
        --nameservers "$(nameservers)" \
        </dev/null >"$log" 2>&1 &
    echo $! >"$(pid_file "$name")"
    disown $!  # not this shell's job: it outlives the script, and stop may kill it without a "Killed" notice
}

show_log_tail() {
    local log
    log=$(log_file "$1")
    echo "---- last lines of $log:" >&2
    if [[ -s "$log" ]]; then
        tail -n 20 "$log" >&2
    else
        echo "(empty)" >&2
    fi
}

# cluster_status: `rocket cluster status` from the first broker or nameserver that answers.
cluster_status() {
    local name
    if [[ ! -t 1 ]]; then
        export COLUMNS=${COLUMNS:-140}  # not a terminal (a log, a pipe): don't squeeze the tables into 80
    fi
    for name in broker1 broker2 ns1 ns2 ns3; do
        if running_pid "$name" >/dev/null; then
            if "${ROCKET_CMD[@]}" cluster status --server "$(tcp_address "$name")"; then
                return 0
            fi
        fi
    done
    echo "cluster.sh: no broker or nameserver answered 'rocket cluster status'" >&2
    return 1
}

cmd_start() {
    local name pid waiting failed=() deadline line
    set_base_dir "${1:-}" yes
    set_port_base no
    for name in "${NODES[@]}"; do
        if pid=$(running_pid "$name"); then
            die "$name is already running (pid $pid) in $BASE_DIR; run: $0 stop '$BASE_DIR'"
        fi
    done
    echo "$PORT_BASE" >"$BASE_DIR/port_base"
    echo "starting 8 nodes in $BASE_DIR (PORT_BASE=$PORT_BASE, rocket command: ${ROCKET_CMD[*]})"
    # All at once: a storage node is ready only once it has registered with the nameservers.
    for name in "${NODES[@]}"; do
        start_node "$name"
    done

    deadline=$((SECONDS + START_TIMEOUT_S))
    waiting=("${NODES[@]}")
    while ((${#waiting[@]} > 0)); do
        local still=()
        for name in "${waiting[@]}"; do
            if line=$(grep -m1 '^rocket ready ' "$(log_file "$name")" 2>/dev/null); then
                echo "  $name: $line"
            elif ! running_pid "$name" >/dev/null; then
                echo "cluster.sh: $name exited before it was ready" >&2
                failed+=("$name")
            else
                still+=("$name")
            fi
        done
        waiting=("${still[@]+"${still[@]}"}")
        if ((${#failed[@]} > 0)); then
            break
        fi
        if ((${#waiting[@]} > 0 && SECONDS >= deadline)); then
            echo "cluster.sh: not ready after ${START_TIMEOUT_S} s: ${waiting[*]}" >&2
            failed+=("${waiting[@]}")
            break
        fi
        if ((${#waiting[@]} > 0)); then
            sleep 0.2
        fi
    done
    if ((${#failed[@]} > 0)); then
        for name in "${failed[@]}"; do
            show_log_tail "$name"
        done
        echo "cluster.sh: start failed; stopping the nodes that were started (logs stay in $BASE_DIR)" >&2
        stop_all
        exit 1
    fi
    echo "all 8 nodes ready; clients can use brokers $(tcp_address broker1) and $(tcp_address broker2)"
    cluster_status || echo "cluster.sh: the nodes are up, but the status call failed" >&2
}

stop_all() {
    local name pid signalled=() deadline
    for name in "${NODES[@]}"; do
        if pid=$(running_pid "$name"); then
            kill -TERM "$pid" 2>/dev/null || true
            signalled+=("$name")
        fi
    done
    if ((${#signalled[@]} == 0)); then
        echo "no node is running in $BASE_DIR"
    else
        echo "sent SIGTERM to ${signalled[*]}; waiting up to ${STOP_TIMEOUT_S} s"
    fi
    deadline=$((SECONDS + STOP_TIMEOUT_S))
    for name in "${signalled[@]+"${signalled[@]}"}"; do
        while pid=$(running_pid "$name") && ((SECONDS < deadline)); do
            sleep 0.2
        done
        if pid=$(running_pid "$name"); then
            echo "cluster.sh: $name (pid $pid) did not stop after ${STOP_TIMEOUT_S} s; sending SIGKILL" >&2
            kill -KILL "$pid" 2>/dev/null || true
            while running_pid "$name" >/dev/null; do
                sleep 0.1
            done
        else
            echo "  $name stopped"
        fi
    done
    for name in "${NODES[@]}"; do
        rm -f "$(pid_file "$name")"
    done
}

cmd_stop() {
    set_base_dir "${1:-}" no
    set_port_base yes
    stop_all
}

cmd_status() {
    local name pid state running=0
    set_base_dir "${1:-}" no
    set_port_base yes
    printf '%-9s %4s  %-15s  %-15s  %s\n' node id tcp http2 process
    for name in "${NODES[@]}"; do
        if pid=$(running_pid "$name"); then
            state="running (pid $pid)"
            running=$((running + 1))
        else
            state=stopped
        fi
        printf '%-9s %4s  %-15s  %-15s  %s\n' "$name" "$(node_id "$name")" "$(tcp_address "$name")" \
            "$(http2_address "$name")" "$state"
    done
    if ((running == 0)); then
        echo "no node is running in $BASE_DIR"
        return 3
    fi
    cluster_status
}

(($# >= 1 && $# <= 2)) || usage
case "$1" in
    start) cmd_start "${2:-}" ;;
    stop) cmd_stop "${2:-}" ;;
    status) cmd_status "${2:-}" ;;
    *) usage ;;
esac
