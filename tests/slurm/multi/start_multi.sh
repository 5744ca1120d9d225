#!/usr/bin/env bash
# Start a real multi-node SLURM on one machine, as root, without systemd or cgroups: munged,
# slurmctld and NODES slurmd (`slurmd -N nodeK`, each with its own port), every slurmd inside
# its own UTS namespace (`unshare --uts`, then `hostname nodeK`), so the tasks it runs see the
# host name nodeK. The filesystem is shared by all "nodes", as a cluster's shared FS is.
# Everything lives under BASE; stop_multi.sh BASE stops it by pid files.
#
#   bash tests/slurm/multi/start_multi.sh BASE [NODES]    then: export SLURM_CONF=BASE/etc/slurm.conf
#
# Knobs (environment): SLURM_NODE_CPUS (default 8 per node: more than the real cores, so several
# small test jobs share them), CRED_EXPIRE (default 5 s: how soon a requeued job may start).
# Ports are free ports chosen here, so this cluster never meets another one on the machine.
# Exit status: 0 up; 3 cannot run here (not root, packages or unshare missing: the message says
# what to do); 1 a daemon did not come up (the log tails are printed).
set -euo pipefail

BASE=${1:?usage: start_multi.sh BASE_DIR [NODES]}
NODES=${2:-2}
mkdir -p "$BASE"
BASE=$(cd "$BASE" && pwd)
NCPU=${SLURM_NODE_CPUS:-8}
CRED_EXPIRE=${CRED_EXPIRE:-5}
SBIN=/usr/sbin

if [ "$(id -u)" -ne 0 ]; then
    echo "start_multi.sh: must run as root (slurmd runs jobs as their users, unshare needs it)" >&2
    exit 3
fi
missing=()
for exe in "$SBIN/munged" "$SBIN/slurmctld" "$SBIN/slurmd" munge unmunge sbatch scontrol sinfo unshare python3; do
    command -v "$exe" >/dev/null 2>&1 || missing+=("$exe")
done
if [ ${#missing[@]} -ne 0 ]; then
    echo "start_multi.sh: missing ${missing[*]}; install them with" \
        "'sudo apt-get install slurmctld slurmd slurm-client munge util-linux'" >&2
    exit 3
fi
if ! unshare --uts true 2>/dev/null; then
    echo "start_multi.sh: 'unshare --uts' is not allowed here (a container without" \
        "CAP_SYS_ADMIN); run the tests as root on a machine or a privileged container" >&2
    exit 3
fi

free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
mkdir -p "$BASE"/{etc,state,log,run,munge}
chmod 700 "$BASE/munge"
MUNGE_SOCK="$BASE/munge/munge.socket.2"
if [ ! -s "$BASE/munge/munge.key" ]; then
    head -c 1024 /dev/urandom > "$BASE/munge/munge.key"
fi
chmod 400 "$BASE/munge/munge.key"
if ! munge -n -S "$MUNGE_SOCK" 2>/dev/null | unmunge -S "$MUNGE_SOCK" >/dev/null 2>&1; then
    "$SBIN/munged" --force --key-file="$BASE/munge/munge.key" --socket="$MUNGE_SOCK" \
        --pid-file="$BASE/munge/munged.pid" --log-file="$BASE/log/munged.log" \
        --seed-file="$BASE/munge/munged.seed"
fi
munge -n -S "$MUNGE_SOCK" | unmunge -S "$MUNGE_SOCK" >/dev/null

HOST=$(hostname -s)
MEM_MB=$(($(awk '/MemTotal/{print $2}' /proc/meminfo) / 1024 / 2 / NODES))
{
    cat <<CONF
# Written by tests/slurm/multi/start_multi.sh for the ckptdash SLURM test tier.
ClusterName=ckptdash-multi
SlurmctldHost=${HOST}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=${MUNGE_SOCK},cred_expire=${CRED_EXPIRE}
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=2
MailProg=/bin/true
StateSaveLocation=${BASE}/state
SlurmdSpoolDir=${BASE}/spool/%n
SlurmctldPidFile=${BASE}/run/slurmctld.pid
SlurmdPidFile=${BASE}/run/slurmd-%n.pid
SlurmctldLogFile=${BASE}/log/slurmctld.log
SlurmdLogFile=${BASE}/log/slurmd-%n.log
ReturnToService=2
SlurmdParameters=config_overrides
JobRequeue=1
MinJobAge=3600
KillWait=5
OverTimeLimit=0
InactiveLimit=0
MessageTimeout=10
CONF
    for i in $(seq 1 "$NODES"); do
        echo "NodeName=node$i NodeHostname=${HOST} NodeAddr=127.0.0.1 Port=$(free_port) CPUs=${NCPU} RealMemory=${MEM_MB} State=UNKNOWN"
    done
    echo "PartitionName=debug Nodes=node[1-${NODES}] Default=YES MaxTime=INFINITE State=UP"
} > "$BASE/etc/slurm.conf"
export SLURM_CONF="$BASE/etc/slurm.conf"

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
alive "$BASE/run/slurmctld.pid" || "$SBIN/slurmctld" -c -f "$SLURM_CONF"
for i in $(seq 1 "$NODES"); do
    mkdir -p "$BASE/spool/node$i"
    alive "$BASE/run/slurmd-node$i.pid" \
        || unshare --uts sh -c "hostname node$i && exec $SBIN/slurmd -N node$i -f '$SLURM_CONF'"
done

for _ in $(seq 1 120); do
    n=$(sinfo -h -N -o '%T' 2>/dev/null | grep -cE 'idle|mixed|allocated' || true)
    if [ "$n" -ge "$NODES" ]; then echo "SLURM_CONF=$SLURM_CONF"; exit 0; fi
    sleep 0.25
done
echo "start_multi.sh: $NODES nodes did not become idle within 30 s; sinfo and logs:" >&2
sinfo -N >&2 || true
tail -n 20 "$BASE"/log/*.log >&2 || true
exit 1
