#!/usr/bin/env bash
# Installs the Debian packages the SLURM, Grid Engine, browser, TLS and DeepSpeed test tiers
# need, when run as root (g++: DeepSpeed compiles its CPU shared-memory collective at its first
# start). Grid Engine's packages are preseeded (cell "default", this host as master) and kept
# from starting daemons: tests/gridengine/start.sh starts them by pid, without systemd.
# Anyone else gets one line saying what to install; in CI (CI=true) that is an error,
# because every tier must run there.
set -euo pipefail
packages=(slurmctld slurmd slurm-client munge chromium openssl g++
          gridengine-master gridengine-exec gridengine-client)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "ckptdash: missing system packages: ${missing[*]} (sudo apt-get install ${missing[*]});" \
         "the SLURM, Grid Engine and browser test tiers skip without them"
    [ "${CI:-}" = "true" ] && exit 1
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
node=$(hostname)
for pkg in gridengine-common gridengine-client gridengine-master gridengine-exec; do
    printf '%s shared/gridengineconfig boolean true\n%s shared/gridenginecell string default\n%s shared/gridenginemaster string %s\n' \
        "$pkg" "$pkg" "$pkg" "$node"
done | debconf-set-selections
own_policy=0
if [ ! -e /usr/sbin/policy-rc.d ]; then  # no daemon starts from the package scripts
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d
    own_policy=1
fi
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
[ $own_policy = 1 ] && rm -f /usr/sbin/policy-rc.d
echo "ckptdash: installed ${missing[*]}"
