#!/usr/bin/env bash
# Stop what start.sh BASE started, by its pid files only: cancel the cluster's jobs, then
# TERM every slurmd, slurmctld and munged (KILL whoever is still there after 10 s).
#   bash tests/slurm/stop.sh BASE [--wipe]      --wipe also removes BASE's SLURM folders
set -uo pipefail
BASE=${1:?usage: stop.sh BASE_DIR [--wipe]}
export SLURM_CONF="$BASE/etc/slurm.conf"
shopt -s nullglob
PIDFILES=("$BASE"/run/slurmd-*.pid "$BASE/run/slurmctld.pid" "$BASE/munge/munged.pid")

alive() { [ -s "$1" ] && kill -0 "$(cat "$1" 2>/dev/null)" 2>/dev/null; }

if alive "$BASE/run/slurmctld.pid"; then
    # Every job of this cluster (its own SLURM_CONF): slurmstepd ends their processes.
    scancel --quiet --full --state=RUNNING,PENDING,SUSPENDED,REQUEUED,CONFIGURING 2>/dev/null \
        || scancel --quiet --user=root 2>/dev/null || true
    for _ in $(seq 1 40); do
        [ -z "$(squeue -h -t R,CG,CF,S 2>/dev/null)" ] && break
        sleep 0.25
    done
fi
for pf in "${PIDFILES[@]}"; do alive "$pf" && kill -TERM "$(cat "$pf" 2>/dev/null)" 2>/dev/null; done
for _ in $(seq 1 40); do
    up=0
    for pf in "${PIDFILES[@]}"; do alive "$pf" && up=1; done
    [ $up = 0 ] && break
    sleep 0.25
done
for pf in "${PIDFILES[@]}"; do alive "$pf" && kill -KILL "$(cat "$pf" 2>/dev/null)" 2>/dev/null; done
rm -f "${PIDFILES[@]}"
if [ "${2:-}" = --wipe ]; then
    rm -rf "$BASE"/{etc,state,spool,log,run,munge}
fi
exit 0
