#!/usr/bin/env bash
# `make test` from a fresh clone of HEAD with a CPU-bound process beside it, as issue 32 asks
# (docs/testing.md, "Within 20 minutes beside a CPU hog"). Prints the wall time of the whole
# `.ci/run` and the CPU the hog got; the run's output goes to OUT/ci.log and each test's CPU,
# wall, start and worker to OUT/tests.tsv.
#
#   bash scripts/loaded-run.sh [OUT]      (OUT defaults to a new temporary folder)
#
# The hog is `python3 -c 'while True: pass'` in a session of its own, as another user's job
# would be. To make the machine look fresh as well, delete the test accounts (userdel
# ckdsec_owner ckdsec_peer; groupdel ckdsec) and ~/.cache/torch_extensions first.
set -euo pipefail
out=${1:-$(mktemp -d)}
mkdir -p "$out"
clone=$(mktemp -d)
chmod 755 "$clone"  # the two-account and nobody tests import the clone as other users
git clone -q "$(git rev-parse --show-toplevel)" "$clone"
setsid python3 -c 'while True: pass' &
hog=$!
trap 'kill "$hog" 2>/dev/null || true' EXIT
start=$(date +%s)
rc=0
(cd "$clone" && CI=true CKPTDASH_TEST_CPU="$out/tests.tsv" setsid bash .ci/run) \
    > "$out/ci.log" 2>&1 || rc=$?
end=$(date +%s)
ticks=$(getconf CLK_TCK)
hog_cpu=$(awk -v t="$ticks" '{printf "%.0f", ($14 + $15) / t}' "/proc/$hog/stat")
echo "exit $rc; .ci/run took $((end - start)) s; the hog got $hog_cpu CPU-s; log: $out/ci.log"
rm -rf "$clone"
exit "$rc"
