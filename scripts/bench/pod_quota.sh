#!/bin/bash
# A pod's CPU limit shared by all its ranks: run the fault bench's train job (4 ranks, no fault) with
# every process of eroica-run in ONE cgroup with a CPU quota of QUOTA CPUs (root; cgroup v1 cpu
# controller or v2 cpu.max; only the v1 path has been run, on a machine with cgroup v1 only), then print the
# cgroup's throttle counter. docs/benchmarks.md §5b.
#
#   flock /tmp/eroica-multirank.lock scripts/bench/pod_quota.sh 1.0 /tmp/pod1 [STEPS]
#
# The ranks' step times go to REPORT_DIR-steps/ (train_bench.py --out).
set -euo pipefail
Q=$1; OUT=$2; STEPS=${3:-100}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PERIOD=100000
QUOTA_US=$(python3 -c "print(int(float('$Q') * $PERIOD))")
if [ -d /sys/fs/cgroup/cpu ] && [ -f /sys/fs/cgroup/cpu/cpu.cfs_period_us ]; then   # v1
    CG=/sys/fs/cgroup/cpu/eroica-pod$$
    mkdir "$CG"; echo $PERIOD > "$CG/cpu.cfs_period_us"; echo "$QUOTA_US" > "$CG/cpu.cfs_quota_us"
    TOP=/sys/fs/cgroup/cpu
else                                                                                  # v2
    CG=/sys/fs/cgroup/eroica-pod$$
    grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control || echo +cpu > /sys/fs/cgroup/cgroup.subtree_control
    mkdir "$CG"; echo "$QUOTA_US $PERIOD" > "$CG/cpu.max"
    TOP=/sys/fs/cgroup
fi
cleanup() {
    for p in $(cat "$CG/cgroup.procs" 2>/dev/null); do echo "$p" > "$TOP/cgroup.procs" 2>/dev/null || true; done
    rmdir "$CG" 2>/dev/null || true
}
trap cleanup EXIT
cd "$ROOT"
bash -c "echo \$\$ > $CG/cgroup.procs; exec timeout 300 .venv/bin/eroica-run --nproc-per-node 4 --report-dir $OUT \
    scripts/faultlib/train_bench.py --steps $STEPS --out $OUT-steps"
grep -E "throttled_(time|usec)" "$CG/cpu.stat" || true
