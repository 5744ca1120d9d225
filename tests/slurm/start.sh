#!/usr/bin/env bash
# Start a real single-node SLURM (munged + slurmctld + slurmd) on localhost, as root, without
# systemd or cgroups. Everything it creates lives under BASE; stop.sh BASE stops it by pid file.
#
#   bash tests/slurm/start.sh BASE        then: export SLURM_CONF=BASE/etc/slurm.conf
#
# Knobs (environment): SLURM_NODE_CPUS (default 8: more than the real cores, so several small
# test jobs run at once), CRED_EXPIRE (default 5 s: a requeued job may start again only after
# the job credential expired, 120 s by default), SLURMCTLD_PORT / SLURMD_PORT (default 6817 /
# 6818; the test fixture picks free ones so two clusters never meet).
# Exit status: 0 up; 3 cannot run here (not root, packages missing: the message says what to do);
# 1 a daemon did not come up (the log tails are printed).
set -euo pipefail

BASE=${1:?usage: start.sh BASE_DIR}
mkdir -p "$BASE"
BASE=$(cd "$BASE" && pwd)
NODE=$(hostname -s)
NCPU=${SLURM_NODE_CPUS:-8}
CRED_EXPIRE=${CRED_EXPIRE:-5}
CTLD_PORT=${SLURMCTLD_PORT:-6817}
SLURMD_PORT=${SLURMD_PORT:-6818}
SBIN=/usr/sbin

if [ "$(id -u)" -ne 0 ]; then
    echo "start.sh: must run as root (slurmd runs jobs as their users); the SLURM tier needs root" >&2
    exit 3
fi
missing=()
for exe in "$SBIN/munged" "$SBIN/slurmctld" "$SBIN/slurmd" munge unmunge sbatch scontrol sinfo; do
    command -v "$exe" >/dev/null 2>&1 || missing+=("$exe")
done
if [ ${#missing[@]} -ne 0 ]; then
    echo "start.sh: missing ${missing[*]}; install them with" \
        "'sudo apt-get install slurmctld slurmd slurm-client munge'" >&2
    exit 3
fi

mkdir -p "$BASE"/{etc,state,spool,log,run,munge}
chmod 700 "$BASE/munge"
MUNGE_SOCK="$BASE/munge/munge.socket.2"

# --- munged: its own key, socket, pid file, log and seed under BASE (not /etc/munge, /run/munge)
if [ ! -s "$BASE/munge/munge.key" ]; then
    head -c 1024 /dev/urandom > "$BASE/munge/munge.key"
fi
chmod 400 "$BASE/munge/munge.key"
if ! munge -n -S "$MUNGE_SOCK" 2>/dev/null | unmunge -S "$MUNGE_SOCK" >/dev/null 2>&1; then
    "$SBIN/munged" --force \
        --key-file="$BASE/munge/munge.key" \
        --socket="$MUNGE_SOCK" \
        --pid-file="$BASE/munge/munged.pid" \
        --log-file="$BASE/log/munged.log" \
        --seed-file="$BASE/munge/munged.seed"
fi
munge -n -S "$MUNGE_SOCK" | unmunge -S "$MUNGE_SOCK" >/dev/null

# --- slurm.conf: one node, no accounting, no cgroups; fast scheduling and requeue
MEM_MB=$(($(awk '/MemTotal/{print $2}' /proc/meminfo) / 1024 / 2))
cat > "$BASE/etc/slurm.conf" <<CONF
# Written by tests/slurm/start.sh for the ckptdash SLURM test tier.
ClusterName=ckptdash
SlurmctldHost=${NODE}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=${CTLD_PORT}
SlurmdPort=${SLURMD_PORT}
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
SlurmdSpoolDir=${BASE}/spool
SlurmctldPidFile=${BASE}/run/slurmctld.pid
SlurmdPidFile=${BASE}/run/slurmd.pid
SlurmctldLogFile=${BASE}/log/slurmctld.log
SlurmdLogFile=${BASE}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ReturnToService=2
SlurmdParameters=config_overrides
JobRequeue=1
MinJobAge=3600
KillWait=5
OverTimeLimit=0
InactiveLimit=0
MessageTimeout=10
NodeName=${NODE} NodeAddr=127.0.0.1 CPUs=${NCPU} RealMemory=${MEM_MB} State=UNKNOWN
PartitionName=debug Nodes=${NODE} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
export SLURM_CONF="$BASE/etc/slurm.conf"

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# --- daemons: both fork into the background and write their pid files; -c starts clean
alive "$BASE/run/slurmctld.pid" || "$SBIN/slurmctld" -c -f "$SLURM_CONF"
alive "$BASE/run/slurmd.pid" || "$SBIN/slurmd" -f "$SLURM_CONF"

# --- up once the node takes jobs
for _ in $(seq 1 120); do
    state=$(sinfo -h -N -o '%T' 2>/dev/null | head -1 || true)
    case "$state" in idle | mixed | allocated) echo "SLURM_CONF=$SLURM_CONF"; exit 0 ;; esac
    sleep 0.25
done
echo "start.sh: the node did not become idle within 30 s (state: '${state:-none}'); logs:" >&2
tail -n 20 "$BASE"/log/*.log >&2 || true
exit 1
