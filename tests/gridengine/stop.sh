#!/usr/bin/env bash
# The Grid Engine test tier's cell (tests/gridengine/conftest.py starts it, stop.sh stops it).
# Tear down what start.sh started: delete all jobs, stop sge_execd and sge_qmaster (by their
# own shutdown commands, then by the pids in their pid files), nothing else.
# Usage: bash stop.sh [--wipe | --purge]
#   --wipe   also delete the cell (spool, job database, configuration): the next start.sh
#            initialises a new cell (job ids start at 1 again)
#   --purge  --wipe, then apt-get purge the gridengine packages and remove the submit user
set -uo pipefail
export SGE_ROOT=/var/lib/gridengine SGE_CELL=default PATH=/usr/bin:/usr/sbin:$PATH
NODE=$(hostname)
SUSER=${SGE_USER:-sgeuser}
QPID=/var/spool/gridengine/qmaster/qmaster.pid
pids() {
  [ -s "$QPID" ] && cat "$QPID"
  for f in /var/spool/gridengine/execd/*/execd.pid; do [ -s "$f" ] && cat "$f"; done
}
running() {  # a live process, not a zombie its parent has not reaped yet
  [ -r "/proc/$1/stat" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
alive() { for p in $(pids); do running "$p" && return 0; done; return 1; }

if command -v qconf >/dev/null && qconf -sh >/dev/null 2>&1; then
  qdel -f -u '*' >/dev/null 2>&1 || true                    # every job, running or pending
  for i in $(seq 1 40); do [ -z "$(qstat -u '*' 2>/dev/null)" ] && break; sleep 0.25; done
  qconf -kej "$NODE" >/dev/null 2>&1 || qconf -ke "$NODE" >/dev/null 2>&1 || true  # execd (and its jobs)
  for i in $(seq 1 40); do
    up=0
    for f in /var/spool/gridengine/execd/*/execd.pid; do [ -s "$f" ] && running "$(cat "$f")" && up=1; done
    [ $up = 0 ] && break; sleep 0.25
  done
  qconf -km >/dev/null 2>&1 || true                         # qmaster
fi
for i in $(seq 1 40); do alive || break; sleep 0.25; done
for p in $(pids); do running "$p" && kill "$p" 2>/dev/null; done   # only the daemons' own pids
for i in $(seq 1 20); do alive || break; sleep 0.25; done
for p in $(pids); do running "$p" && kill -9 "$p" 2>/dev/null; done
rm -f "$QPID" /var/spool/gridengine/execd/*/execd.pid

case "${1:-}" in
  --wipe|--purge)
    rm -rf /var/spool/gridengine/spooldb /var/spool/gridengine/qmaster /var/spool/gridengine/execd/*
    rm -f "$SGE_ROOT/$SGE_CELL/common/act_qmaster" "$SGE_ROOT/$SGE_CELL/common/host_aliases" \
          "$SGE_ROOT/$SGE_CELL/common/accounting"
    ;;
esac
if [ "${1:-}" = --purge ]; then
  DEBIAN_FRONTEND=noninteractive apt-get purge -y -q gridengine-master gridengine-exec \
      gridengine-client gridengine-common >/dev/null 2>&1 || true
  echo PURGE | debconf-communicate gridengine-common >/dev/null 2>&1 || true
  rm -rf /var/lib/gridengine /var/spool/gridengine /var/run/gridengine
  id "$SUSER" >/dev/null 2>&1 && userdel -r "$SUSER" 2>/dev/null
fi
exit 0
