#!/usr/bin/env bash
# Runs the GPU-marked tests of an installed cudnn_graph in parallel shards and prints one summary.
# Usage (on a GPU machine, from the project root, after `pip install .`):
#   bash tools/run_gpu_suite.sh [SHARDS] [LOGDIR] [pytest selection ...]
# Test ids contain spaces, so each shard reads its ids from a pytest @argsfile.
# PART=k/n (environment) runs every n-th id from the k-th on (k = 1..n): the suite (~720 ids, ~13 minutes in 8
# shards on an H100, the CuTe and cuTile compiles most of it) in n calls of a 10-minute limit.
set -uo pipefail
shards=${1:-8}; logs=${2:-/tmp/gpu-suite}; shift 2 2>/dev/null || shift $#
root=$(pwd); rm -rf "$logs"; mkdir -p "$logs"
sel=("$@"); [[ ${#sel[@]} -eq 0 ]] && sel=("$root/tests")
cd /tmp
python3 -m pytest -m gpu --collect-only -q -p no:cacheprovider "${sel[@]}" 2>/dev/null | grep "::" | sed "s|^|$root/|" > "$logs/all_ids.txt"
part=${PART:-1/1}; k=${part%/*}; n=${part#*/}
if ! [[ $k =~ ^[0-9]+$ && $n =~ ^[0-9]+$ ]] || (( n < 1 || k < 1 || k > n )); then
  echo "PART must be k/n with 1 <= k <= n; got '$part'" >&2; exit 2
fi
awk -v k="$k" -v n="$n" '(NR - k) % n == 0' "$logs/all_ids.txt" > "$logs/ids.txt"
total=$(wc -l < "$logs/ids.txt"); echo "collected $(wc -l < "$logs/all_ids.txt") gpu test ids; part $part: $total"
split -n "r/$shards" -d "$logs/ids.txt" "$logs/shard."
pids=()
for f in "$logs"/shard.*; do
  python3 -m pytest -m gpu -q -p no:cacheprovider -rs "@$f" > "$f.log" 2>&1 & pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
for f in "$logs"/shard.*.log; do tail -1 "$f"; done
python3 - "$logs" <<'PY'
import re, sys, glob
tot = {}
for f in glob.glob(sys.argv[1] + "/shard.*.log"):
    last = open(f).read().strip().splitlines()[-1]
    for n, what in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)", last):
        tot[what] = tot.get(what, 0) + int(n)
print("GPU SUITE TOTAL:", ", ".join(f"{v} {k}" for k, v in sorted(tot.items())))
PY
grep -h -E "^(FAILED|ERROR)" "$logs"/shard.*.log | head -40
