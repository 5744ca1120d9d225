#!/usr/bin/env bash
# The Grid Engine test tier's cell (tests/gridengine/conftest.py starts it, stop.sh stops it).
# Start a real one-host Son of Grid Engine cell (sge_qmaster + sge_execd) on this machine,
# from nothing on a fresh Debian (bookworm) machine, without systemd. Idempotent; run as root.
#
# Usage: bash start.sh
#   env: SGE_SLOTS (default 4; may exceed the real cores), SGE_NOTIFY (queue notify time,
#        default 00:00:10; Grid Engine's own default is 00:00:60), SGE_LOAD_REPORT (execd's
#        load_report_time, default 00:00:10; Grid Engine's own default is 00:00:40),
#        SGE_USER (a non-root submit
#        user, default sgeuser, uid 2001), SGE_MIN_UID (default 0: root may run jobs too;
#        Debian's cell default is 1000), SGE_NO_ALIASES=1 (skip host_aliases: shows the
#        "access denied (client IP resolved to host name "localhost" ...)" failure).
# Afterwards: . /var/lib/gridengine/default/common/settings.sh   (SGE_ROOT, SGE_CELL)
#   qsub as root, or as $SGE_USER: su - sgeuser -c 'qsub ...' (tools/sge/as_user.sh)
#
# What it does: preseeds debconf (automatic cell "default", master = this host), installs
# gridengine-{master,exec,client} with service starts blocked (Debian's init scripts are
# not used), maps "localhost" to the host's own name in host_aliases (127.0.0.1 reverse-
# resolves to localhost here, which qmaster would refuse as "not identical to client's
# host name"), starts qmaster, adds this host as admin/submit/exec host, a queue all.q
# with SGE_SLOTS slots, no load thresholds, a 1 s scheduling interval, a parallel
# environment "smp" ($pe_slots), and starts execd. Stop with stop.sh.
set -euo pipefail
T0=$(date +%s.%N)
SLOTS=${SGE_SLOTS:-4}
NOTIFY=${SGE_NOTIFY:-00:00:10}
# execd's report interval. It also sets how long qmaster keeps a rescheduled job's old run on
# the host's reschedule list (about two reports after the kill order): an end of that run
# reported later is taken as the job's own end, and the job is not rerun.
LOAD_REPORT=${SGE_LOAD_REPORT:-00:00:10}
SUSER=${SGE_USER:-sgeuser}
SUID=${SGE_UID:-2001}
MIN_UID=${SGE_MIN_UID:-0}   # Debian's cell default is 1000 (no root jobs); 0 lets root submit too
export SGE_ROOT=/var/lib/gridengine SGE_CELL=default
COMMON=$SGE_ROOT/$SGE_CELL/common
NODE=$(hostname)
export PATH=/usr/bin:/usr/sbin:$PATH
log() { printf '[sge start %5.1fs] %s\n' "$(awk -v a="$(date +%s.%N)" -v b="$T0" 'BEGIN{print a-b}')" "$*"; }

# --- host name must resolve (SGE refuses a host it cannot resolve)
if ! getent hosts "$NODE" >/dev/null; then
  echo "127.0.0.1 $NODE" >> /etc/hosts
  log "added '127.0.0.1 $NODE' to /etc/hosts"
fi

# --- packages (debconf preseeded: no prompts)
if [ ! -x /usr/lib/gridengine/sge_qmaster ] || [ ! -x /usr/lib/gridengine/sge_execd ] \
   || [ ! -x /usr/lib/gridengine/qsub ]; then
  export DEBIAN_FRONTEND=noninteractive
  cat <<SEL | debconf-set-selections
gridengine-common shared/gridengineconfig boolean true
gridengine-common shared/gridenginecell string $SGE_CELL
gridengine-common shared/gridenginemaster string $NODE
gridengine-client shared/gridengineconfig boolean true
gridengine-client shared/gridenginecell string $SGE_CELL
gridengine-client shared/gridenginemaster string $NODE
gridengine-master shared/gridengineconfig boolean true
gridengine-master shared/gridenginecell string $SGE_CELL
gridengine-master shared/gridenginemaster string $NODE
gridengine-exec shared/gridengineconfig boolean true
gridengine-exec shared/gridenginecell string $SGE_CELL
gridengine-exec shared/gridenginemaster string $NODE
SEL
  # Keep the package scripts from starting the daemons (we start them below, by pid).
  own_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; own_policy=1
  fi
  [ -n "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' 2>/dev/null | head -1)" ] || apt-get update -q
  apt-get install -y -q --no-install-recommends \
    gridengine-master gridengine-exec gridengine-client >${TMPDIR:-/tmp}/sge-apt.log 2>&1 \
    || { apt-get update -q && apt-get install -y -q --no-install-recommends \
           gridengine-master gridengine-exec gridengine-client >>${TMPDIR:-/tmp}/sge-apt.log 2>&1; } \
    || { tail -30 ${TMPDIR:-/tmp}/sge-apt.log; [ $own_policy = 1 ] && rm -f /usr/sbin/policy-rc.d; exit 1; }
  [ $own_policy = 1 ] && rm -f /usr/sbin/policy-rc.d
  log "packages installed"
fi

# --- the cell: spool + default configuration (the master postinst does this when preseeded)
if [ ! -e /var/spool/gridengine/spooldb/sge ]; then
  mkdir -p /var/spool/gridengine/{qmaster/job_scripts,spooldb,execd} "$COMMON"
  chown -R sgeadmin:sgeadmin /var/spool/gridengine "$SGE_ROOT/$SGE_CELL"
  [ -s "$COMMON/bootstrap" ] || install -m0644 -o sgeadmin -g sgeadmin \
      /usr/share/gridengine/default-bootstrap "$COMMON/bootstrap"
  su -s /bin/sh -c "/usr/share/gridengine/scripts/init_cluster $SGE_ROOT $SGE_CELL /var/spool/gridengine/spooldb sgeadmin" sgeadmin
  log "cell initialised"
fi
echo "$NODE" > "$COMMON/act_qmaster"
# 127.0.0.1 -> "localhost" on reverse lookup; make SGE treat localhost (and any other
# names of 127.0.0.1 in /etc/hosts) as this host's own name.
if [ "${SGE_NO_ALIASES:-0}" = 1 ]; then rm -f "$COMMON/host_aliases"; else
  aliases=$(awk -v n="$NODE" '$1=="127.0.0.1"{for(i=2;i<=NF;i++) if($i!=n) printf " %s",$i}' /etc/hosts)
  echo "$NODE$aliases" > "$COMMON/host_aliases"
  chown sgeadmin:sgeadmin "$COMMON/host_aliases"
fi
chown sgeadmin:sgeadmin "$COMMON/act_qmaster"
mkdir -p /var/run/gridengine && chown sgeadmin:sgeadmin /var/run/gridengine

# --- qmaster
QPID=/var/spool/gridengine/qmaster/qmaster.pid
if ! { [ -s "$QPID" ] && kill -0 "$(cat "$QPID")" 2>/dev/null; }; then
  /usr/sbin/sge_qmaster
  log "sge_qmaster started"
fi
for i in $(seq 1 120); do qconf -sh >/dev/null 2>&1 && break; sleep 0.25; done
qconf -sh >/dev/null || { echo "qmaster did not answer; see /var/spool/gridengine/qmaster/messages" >&2; exit 1; }
log "qmaster answers (pid $(cat "$QPID"))"

# --- configuration (each step is a no-op if already done)
qconf -sh 2>/dev/null | grep -qx "$NODE" || qconf -ah "$NODE" >/dev/null 2>&1
qconf -ss 2>/dev/null | grep -qx "$NODE" || qconf -as "$NODE" >/dev/null 2>&1
TMPD=$(mktemp -d)
trap 'rm -rf "$TMPD"' EXIT
# scheduler: schedule every second, rescheduled jobs may start at once
qconf -ssconf > "$TMPD/sched"
sed -i -e 's/^schedule_interval .*/schedule_interval                 0:0:1/' \
       -e 's/^flush_submit_sec .*/flush_submit_sec                  1/' \
       -e 's/^flush_finish_sec .*/flush_finish_sec                  1/' "$TMPD/sched"
qconf -Msconf "$TMPD/sched" >/dev/null 2>&1 || true
# global configuration: quicker load reports
qconf -sconf global > "$TMPD/global"
sed -i -e "s/^load_report_time .*/load_report_time             $LOAD_REPORT/" \
       -e "s/^min_uid .*/min_uid                      $MIN_UID/" \
       -e "s/^min_gid .*/min_gid                      $MIN_UID/" \
       -e 's/^mailer .*/mailer                       \/bin\/true/' "$TMPD/global"
qconf -Mconf "$TMPD/global" >/dev/null 2>&1 || true
# exec host
if ! qconf -sel 2>/dev/null | grep -qx "$NODE"; then
  printf 'hostname %s\nload_scaling NONE\ncomplex_values NONE\nuser_lists NONE\nxuser_lists NONE\nprojects NONE\nxprojects NONE\nusage_scaling NONE\nreport_variables NONE\n' "$NODE" > "$TMPD/exech"
  qconf -Ae "$TMPD/exech" >/dev/null 2>&1
fi
# parallel environment: all slots of a job on this host
cat > "$TMPD/pe" <<PE
pe_name            smp
slots              $SLOTS
user_lists         NONE
xuser_lists        NONE
start_proc_args    NONE
stop_proc_args     NONE
allocation_rule    \$pe_slots
control_slaves     TRUE
job_is_first_task  TRUE
urgency_slots      min
accounting_summary FALSE
qsort_args         NONE
PE
if qconf -spl 2>/dev/null | grep -qx smp; then qconf -Mp "$TMPD/pe" >/dev/null 2>&1; else qconf -Ap "$TMPD/pe" >/dev/null 2>&1; fi
# hostgroup
printf 'group_name @allhosts\nhostlist %s\n' "$NODE" > "$TMPD/hg"
if qconf -shgrpl 2>/dev/null | grep -qx @allhosts; then qconf -Mhgrp "$TMPD/hg" >/dev/null 2>&1; else qconf -Ahgrp "$TMPD/hg" >/dev/null 2>&1; fi
# queue
cat > "$TMPD/q" <<Q
qname                 all.q
hostlist              @allhosts
seq_no                0
load_thresholds       NONE
suspend_thresholds    NONE
nsuspend              1
suspend_interval      00:05:00
priority              0
min_cpu_interval      00:05:00
processors            UNDEFINED
qtype                 BATCH INTERACTIVE
ckpt_list             NONE
pe_list               smp
rerun                 FALSE
slots                 $SLOTS
tmpdir                /tmp
shell                 /bin/bash
prolog                NONE
epilog                NONE
shell_start_mode      unix_behavior
starter_method        NONE
suspend_method        NONE
resume_method         NONE
terminate_method      NONE
notify                $NOTIFY
owner_list            NONE
user_lists            NONE
xuser_lists           NONE
subordinate_list      NONE
complex_values        NONE
projects              NONE
xprojects             NONE
calendar              NONE
initial_state         default
s_rt                  INFINITY
h_rt                  INFINITY
s_cpu                 INFINITY
h_cpu                 INFINITY
s_fsize               INFINITY
h_fsize               INFINITY
s_data                INFINITY
h_data                INFINITY
s_stack               INFINITY
h_stack               INFINITY
s_core                INFINITY
h_core                INFINITY
s_rss                 INFINITY
h_rss                 INFINITY
s_vmem                INFINITY
h_vmem                INFINITY
Q
if qconf -sql 2>/dev/null | grep -qx all.q; then qconf -Mq "$TMPD/q" >/dev/null 2>&1; else qconf -Aq "$TMPD/q" >/dev/null 2>&1; fi
log "configured: host $NODE, queue all.q ($SLOTS slots, notify $NOTIFY), pe smp"

# --- execd
# execd names its spool folder after the name commlib resolves for it (here "localhost")
execd_pid() { for f in /var/spool/gridengine/execd/*/execd.pid; do
  [ -s "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && { cat "$f"; return 0; }; done; return 1; }
if ! execd_pid >/dev/null; then
  /usr/sbin/sge_execd
  log "sge_execd started"
fi

# --- a non-root submit user (uid 2001: allowed even with Debian's min_uid 1000)
if ! id "$SUSER" >/dev/null 2>&1; then
  useradd -m -u "$SUID" -s /bin/bash "$SUSER"
  log "user $SUSER created"
fi
grep -q gridengine/default/common/settings.sh "/home/$SUSER/.profile" 2>/dev/null \
  || echo ". $COMMON/settings.sh" >> "/home/$SUSER/.profile"

# --- wait until the queue instance is usable (execd registered, not in state u)
for i in $(seq 1 240); do
  st=$(qstat -f -q "all.q@$NODE" 2>/dev/null | awk -v q="all.q@$NODE" '$1==q{print ($6==""?"ok":$6)}')
  [ "$st" = ok ] && break
  sleep 0.25
done
[ "$st" = ok ] || { qstat -f; echo "queue all.q@$NODE not ready (state '$st'); see /var/spool/gridengine/execd/$NODE/messages" >&2; exit 1; }
qmod -c "all.q@$NODE" >/dev/null 2>&1 || true   # clear an error state left over from earlier runs
qstat -f
log "ready: qmaster pid $(cat "$QPID"), execd pid $(execd_pid || echo '?')"
echo ". $COMMON/settings.sh    # then qsub as $SUSER: su - $SUSER -c 'qsub ...'"
