#!/usr/bin/env bash
# Stop the single-node SLURM that tests/slurm/setup_slurm.sh started: cancel its jobs, then end
# exactly the PIDs listed in $DIR/pids (SIGTERM, then SIGKILL after 10 s). Nothing else is
# touched; the logs stay in $DIR/log. Without a pids file there is nothing to stop (exit 0).
set -uo pipefail

DIR="${DASKQUEUE_SLURM_DIR:-/tmp/daskqueue-slurm}"
PIDS="$DIR/pids"
[ -f "$PIDS" ] || { echo "stop_slurm: nothing to stop (no $PIDS)"; exit 0; }

alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

# Jobs first, while slurmd still runs to end their processes.
if SLURM_CONF="$DIR/slurm.conf" timeout 10 squeue -h -o %i >/dev/null 2>&1; then
    SLURM_CONF="$DIR/slurm.conf" timeout 10 scancel --user=root >/dev/null 2>&1 || true
    deadline=$((SECONDS + 15))
    while [ -n "$(SLURM_CONF="$DIR/slurm.conf" timeout 5 squeue -h -o %i 2>/dev/null)" ] && [ $SECONDS -lt $deadline ]; do
        sleep 0.5
    done
fi

# Daemons in reverse order of start: slurmd, slurmctld, munged.
mapfile -t entries < <(tac "$PIDS")
for entry in "${entries[@]}"; do
    read -r name pid <<<"$entry"
    alive "$pid" && kill -TERM "$pid" 2>/dev/null
done
deadline=$((SECONDS + 10))
for entry in "${entries[@]}"; do
    read -r name pid <<<"$entry"
    while alive "$pid" && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
    if alive "$pid"; then
        kill -KILL "$pid" 2>/dev/null
        echo "stop_slurm: $name ($pid) did not stop on SIGTERM: killed"
    fi
done
rm -f "$PIDS"
echo "stop_slurm: stopped ${#entries[@]} daemons started by setup_slurm.sh"
