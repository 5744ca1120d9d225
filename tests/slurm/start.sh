#!/usr/bin/env bash
# Start a real SLURM on this machine (munged + slurmctld + slurmd), as root, without systemd or
# cgroups. Everything it creates lives under BASE; stop.sh BASE stops it by pid files.
#
#   bash tests/slurm/start.sh BASE          one node: this machine, under its own host name
#   bash tests/slurm/start.sh BASE NODES    NODES nodes node1..nodeN on this machine: one
#       `slurmd -N nodeK` each (its own port), each inside its own UTS namespace (`unshare
#       --uts`, then `hostname nodeK`), so the tasks it runs see the host name nodeK. The
#       filesystem is shared by all "nodes", as a cluster's shared filesystem is.
#   then: export SLURM_CONF=BASE/etc/slurm.conf
#
# Knobs (environment): SLURM_NODE_CPUS (default 8 per node: more than the real cores, so several
# small test jobs run at once), CRED_EXPIRE (default 5 s: a requeued job may start again only
# after the job credential expired, 120 s by default), SLURMCTLD_PORT / SLURMD_PORT (default:
# free ports picked here, so this cluster never meets another one on the machine).
# Exit status: 0 up; 3 cannot run here (not root, packages or unshare missing: the message says
# what to do); 1 a daemon did not come up (the log tails are printed).
set -euo pipefail

BASE=${1:?usage: start.sh BASE_DIR [NODES]}
NODES=${2:-}
mkdir -p "$BASE"
BASE=$(cd "$BASE" && pwd)
HOST=$(hostname -s)
NCPU=${SLURM_NODE_CPUS:-8}
CRED_EXPIRE=${CRED_EXPIRE:-5}
SBIN=/usr/sbin
if [ -n "$NODES" ]; then
    NAMES=$(seq -f 'node%g' 1 "$NODES")
    NEEDS="unshare"
else
    NAMES=$HOST
    NEEDS=""
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "start.sh: must run as root (slurmd runs jobs as their users); the SLURM tier needs root" >&2
    exit 3
fi
missing=()
for exe in "$SBIN/munged" "$SBIN/slurmctld" "$SBIN/slurmd" munge unmunge sbatch scontrol sinfo \
    python3 $NEEDS; do
    command -v "$exe" >/dev/null 2>&1 || missing+=("$exe")
done
if [ ${#missing[@]} -ne 0 ]; then
    echo "start.sh: missing ${missing[*]}; install them with" \
        "'sudo apt-get install slurmctld slurmd slurm-client munge util-linux'" >&2
    exit 3
fi
if [ -n "$NODES" ] && ! unshare --uts true 2>/dev/null; then
    echo "start.sh: 'unshare --uts' is not allowed here (a container without" \
        "CAP_SYS_ADMIN); run the tests as root on a machine or a privileged container" >&2
    exit 3
fi

free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
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

# --- what a step that outlives its SIGKILL leaves behind: slurmd runs this (as root) when
# UnkillableStepTimeout passes, before it drains the node ("Kill task failed"); the harness
# prints BASE/log/unkillable.log with a timed-out scenario's context.
cat > "$BASE/etc/unkillable.sh" <<PROG
#!/bin/sh
{
    echo "=== \$(date '+%FT%T') unkillable step: job \${SLURM_JOB_ID:-?} step \${SLURM_STEP_ID:-?}"
    ps -eo pid,ppid,pgid,sid,stat,wchan:32,etime,args | cut -c1-240
    for st in /proc/[0-9]*/stat; do
        case "\$(cut -d' ' -f3 "\$st" 2>/dev/null)" in D|Z)
            d=\${st%/stat}; echo "--- \$d: \$(tr '\\0' ' ' < "\$d/cmdline" 2>/dev/null | cut -c1-200)"
            cat "\$d/stack" 2>/dev/null;;
        esac
    done
} >> "$BASE/log/unkillable.log" 2>&1
PROG
chmod 755 "$BASE/etc/unkillable.sh"

# --- slurm.conf: no accounting, no cgroups; fast scheduling and requeue; per-node files by %n
N=$(echo "$NAMES" | wc -w)
MEM_MB=$(($(awk '/MemTotal/{print $2}' /proc/meminfo) / 1024 / 2 / N))
{
    cat <<CONF
# Written by tests/slurm/start.sh for the ckptdash SLURM test tier.
ClusterName=ckptdash
SlurmctldHost=${HOST}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=${SLURMCTLD_PORT:-$(free_port)}
SlurmdPort=${SLURMD_PORT:-$(free_port)}
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
SlurmctldDebug=info
SlurmdDebug=info
ReturnToService=2
SlurmdParameters=config_overrides
JobRequeue=1
MinJobAge=3600
KillWait=5
# 60 s by default. Twenty test jobs share two cores here, and one CI run saw a requeued
# torchrun step still not ended 65 s after its SIGKILL: the node drained and every later
# scenario waited on it. A longer wait keeps a slow end from draining the node; the program
# records what was left if one really does not end.
UnkillableStepTimeout=180
UnkillableStepProgram=${BASE}/etc/unkillable.sh
OverTimeLimit=0
InactiveLimit=0
MessageTimeout=10
CONF
    for name in $NAMES; do
        # Several nodes share this machine's address: each slurmd needs a port of its own.
        port=$([ -n "$NODES" ] && echo " Port=$(free_port)" || true)
        echo "NodeName=$name NodeHostname=${HOST} NodeAddr=127.0.0.1${port} CPUs=${NCPU}" \
            "RealMemory=${MEM_MB} State=UNKNOWN"
    done
    echo "PartitionName=debug Nodes=$(echo $NAMES | tr ' ' ,) Default=YES MaxTime=INFINITE" \
        "State=UP OverSubscribe=NO"
} > "$BASE/etc/slurm.conf"
export SLURM_CONF="$BASE/etc/slurm.conf"

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# --- daemons: each forks into the background and writes its pid file; -c starts clean
alive "$BASE/run/slurmctld.pid" || "$SBIN/slurmctld" -c -f "$SLURM_CONF"
for name in $NAMES; do
    mkdir -p "$BASE/spool/$name"
    alive "$BASE/run/slurmd-$name.pid" && continue
    if [ -n "$NODES" ]; then
        unshare --uts sh -c "hostname $name && exec $SBIN/slurmd -N $name -f '$SLURM_CONF'"
    else
        "$SBIN/slurmd" -f "$SLURM_CONF"
    fi
done

# --- up once every node takes jobs
for _ in $(seq 1 120); do
    up=$(sinfo -h -N -o '%T' 2>/dev/null | grep -cE '^(idle|mixed|allocated)' || true)
    if [ "$up" -ge "$N" ]; then echo "SLURM_CONF=$SLURM_CONF"; exit 0; fi
    sleep 0.25
done
echo "start.sh: $N node(s) did not become idle within 30 s; sinfo and logs:" >&2
sinfo -N >&2 || true
tail -n 20 "$BASE"/log/*.log >&2 || true
exit 1
