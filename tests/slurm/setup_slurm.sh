#!/usr/bin/env bash
# Start a private single-node SLURM (Debian's slurm-wlm + munge) for the `slurm` test lane.
#
#   bash tests/slurm/setup_slurm.sh          # install if absent, start, wait until the node is idle
#   bash tests/slurm/stop_slurm.sh           # stop exactly what this script started
#
# Everything lives in $DASKQUEUE_SLURM_DIR (default /tmp/daskqueue-slurm): slurm.conf, munge's
# key and socket, state and spool dirs, logs, and `pids` (the PIDs this script started). Nothing
# is written under /etc: clients find the cluster through SLURM_CONF=$DIR/slurm.conf.
#
# Idempotent: when the PIDs in `pids` are alive and the node answers, it prints "already
# running" and does nothing. On success the last line is `SLURM_CONF=<path>`; on failure it
# prints one line `setup_slurm: cannot start SLURM: <reason>` and exits non-zero (the tests
# skip with that line).
set -uo pipefail

DIR="${DASKQUEUE_SLURM_DIR:-/tmp/daskqueue-slurm}"
CONF="$DIR/slurm.conf"
PIDS="$DIR/pids"
WAIT_S="${DASKQUEUE_SLURM_WAIT_S:-60}"
NODE="$(hostname -s 2>/dev/null || echo localhost)"

fail() {
    echo "setup_slurm: cannot start SLURM: $*"
    exit 1
}

alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

node_state() { SLURM_CONF="$CONF" timeout 10 sinfo -h -N -n "$NODE" -o '%T' 2>/dev/null | head -1; }

# -- already running? -----------------------------------------------------------------------------
if [ -f "$PIDS" ]; then
    all_alive=1
    while read -r _name pid; do alive "$pid" || all_alive=0; done <"$PIDS"
    if [ "$all_alive" = 1 ] && [ -n "$(node_state)" ]; then
        echo "setup_slurm: already running (node $NODE: $(node_state)); nothing done"
        echo "SLURM_CONF=$CONF"
        exit 0
    fi
    echo "setup_slurm: a previous start is partly gone; stopping what is left of it"
    bash "$(dirname "$0")/stop_slurm.sh" >/dev/null 2>&1 || true
fi

# -- install --------------------------------------------------------------------------------------
missing=0
for cmd in munged slurmctld slurmd sinfo sbatch scancel squeue; do
    command -v "$cmd" >/dev/null 2>&1 || missing=1
done
if [ "$missing" = 1 ]; then
    [ "$(id -u)" = 0 ] || fail "slurm-wlm/munge are not installed and this is not root (install them: apt-get install slurm-wlm munge)"
    command -v apt-get >/dev/null 2>&1 || fail "slurm-wlm/munge are not installed and there is no apt-get"
    echo "setup_slurm: installing slurm-wlm and munge with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    # The package scripts would start the services: only where there is a service manager,
    # and never ours (ours run from $DIR with their own config).
    if ! apt-get install -y -q --no-install-recommends slurm-wlm munge >"/tmp/daskqueue-slurm-apt.log" 2>&1; then
        timeout 120 apt-get update -q >>"/tmp/daskqueue-slurm-apt.log" 2>&1
        apt-get install -y -q --no-install-recommends slurm-wlm munge >>"/tmp/daskqueue-slurm-apt.log" 2>&1 \
            || fail "apt-get install slurm-wlm munge failed (see /tmp/daskqueue-slurm-apt.log: $(tail -1 /tmp/daskqueue-slurm-apt.log))"
    fi
    for cmd in munged slurmctld slurmd sinfo sbatch scancel squeue; do
        command -v "$cmd" >/dev/null 2>&1 || fail "$cmd is still missing after installing slurm-wlm and munge"
    done
fi
[ "$(id -u)" = 0 ] || fail "the single-node SLURM runs its daemons as root (SlurmUser=root): run as root"

# -- configure ------------------------------------------------------------------------------------
# Only a directory this script made is cleared (its marker file says so).
if [ -e "$DIR" ]; then
    [ -f "$DIR/.daskqueue-slurm" ] || fail "$DIR exists and was not made by this script: set DASKQUEUE_SLURM_DIR"
    rm -rf "$DIR"
fi
mkdir -p "$DIR"/{munge,state,spool,log} && touch "$DIR/.daskqueue-slurm" || fail "cannot create $DIR"
chmod 0755 "$DIR"
chmod 0700 "$DIR/munge"
# A private munge key: never the system's /etc/munge/munge.key.
head -c 1024 /dev/urandom >"$DIR/munge/munge.key" && chmod 0400 "$DIR/munge/munge.key" \
    || fail "cannot write a munge key in $DIR/munge"

mem_mb=$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)
# What slurmd sees may be a little less than MemTotal: stay below it, or the node is drained.
real_mb=$((mem_mb * 95 / 100))
cpus=2
[ "$(nproc)" -ge 2 ] || cpus="$(nproc)"

cat >"$CONF" <<EOF
# Written by tests/slurm/setup_slurm.sh: a single-node SLURM for daskqueue's test lane.
ClusterName=daskqueue-test
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
# A cancelled job's processes get SIGTERM, then SIGKILL this many seconds later.
KillWait=5
MinJobAge=30
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$real_mb State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF

# -- start ----------------------------------------------------------------------------------------
: >"$PIDS"
start() {  # name, command...: in the background, in a session of its own, PID recorded
    local name="$1"; shift
    setsid "$@" </dev/null >>"$DIR/log/$name.out" 2>&1 &
    echo "$name $!" >>"$PIDS"
}
start munged munged -F --force --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge/munge.key" \
    --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed"
deadline=$((SECONDS + 15))
until [ -S "$DIR/munge/munge.socket" ]; do
    [ $SECONDS -lt $deadline ] || fail "munged did not start: $(tail -1 "$DIR/log/munged.out" "$DIR/log/munged.log" 2>/dev/null | grep -v '^$' | tail -1)"
    sleep 0.2
done
export SLURM_CONF="$CONF"
start slurmctld slurmctld -D -i -f "$CONF"
start slurmd slurmd -D -f "$CONF"

deadline=$((SECONDS + WAIT_S))
while :; do
    state="$(node_state)"
    case "$state" in idle*) break ;; esac
    while read -r name pid; do
        alive "$pid" || { reason="$(grep -hiE 'error|fatal' "$DIR/log/$name.out" "$DIR/log/$name.log" 2>/dev/null | tail -1)"
                          bash "$(dirname "$0")/stop_slurm.sh" >/dev/null 2>&1
                          fail "$name exited: ${reason:-see $DIR/log}"; }
    done <"$PIDS"
    if [ $SECONDS -ge $deadline ]; then
        reason="$(grep -hiE 'error|fatal' "$DIR/log/slurmctld.log" "$DIR/log/slurmd.log" 2>/dev/null | tail -1)"
        bash "$(dirname "$0")/stop_slurm.sh" >/dev/null 2>&1
        fail "node $NODE not idle within ${WAIT_S}s (state '${state:-no answer}'): ${reason:-see $DIR/log}"
    fi
    sleep 0.5
done
echo "setup_slurm: started munged, slurmctld, slurmd (PIDs in $PIDS); node $NODE idle, CPUs=$cpus RealMemory=$real_mb"
echo "SLURM_CONF=$CONF"
