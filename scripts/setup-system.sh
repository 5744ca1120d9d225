#!/usr/bin/env bash
# Installs the Debian packages the SLURM, browser, TLS and DeepSpeed test tiers need, when run
# as root (g++: DeepSpeed compiles its CPU shared-memory collective at its first start).
# Anyone else gets one line saying what to install; in CI (CI=true) that is an error,
# because every tier must run there.
set -euo pipefail
packages=(slurmctld slurmd slurm-client munge chromium openssl g++)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "ckptdash: missing system packages: ${missing[*]} (sudo apt-get install ${missing[*]});" \
         "the SLURM and browser test tiers skip without them"
    [ "${CI:-}" = "true" ] && exit 1
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "ckptdash: installed ${missing[*]}"
