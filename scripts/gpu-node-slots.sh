#!/usr/bin/env bash
# Several runs side by side in one GPU device call: each slot is a file of gpu-node-run.sh invocations run in turn
# (each its own run, its own results and environments), all slots at once on the node's GPUs, every invocation
# stopped cleanly by DEADLINE (seconds from now). Small distributed jobs leave two GPUs mostly idle; on 2 x H200 five
# slots ran 162 records in one 10-minute call (results/runs/gpu-history-ws2-20261126T145149Z-e15a/NOTES.md). Timings
# measured this way are shared; outcomes are recorded as they come (a hang is a hang), the NOTES say what ran beside.
#   scripts/gpu-node-slots.sh DEADLINE OUT NAME=PACK... -- SLOTFILE...
# A slot file holds one invocation per line:  PROFILE NAME [harness matrix args...] [--resume RUN_ID]
# (--resume continues a committed run: COMPAT_MATRIX_RUN), or  check NAME LOCK DAY [--scenario ...]  (the day's era
# overlay from matrix/locks/LOCK.json installed with pip --target, then `compat-matrix check` in it), or
# run NAME COMMAND...  (any command, e.g. a probe under scripts/probes/, its output in slotN/NAME.log; $SLOT_DIR is
# the slot's folder).
# Everything OUT holds at the end is one tarball, OUT/call.tgz (a device call brings back at most 8 files).
set -uo pipefail
if [ $# -lt 4 ] || [[ ! " $* " =~ " -- " ]]; then
    sed -n '2,14p' "$0" >&2
    exit 2
fi
# NVLink multicast off for every run and check (as gpu-node-run.sh sets it for its own runs).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
deadline=$(( $(date +%s) + $1 )); out=$2; shift 2
declare -A wheels
while [ "$1" != "--" ]; do
  name=${1%%=*}; pack=${1#*=}; shift
  dest=/tmp/wheels-$name; mkdir -p "$dest"
  ( t=$(date +%s); python3 -m harness wheelhouse --unpack "$pack" --dest "$dest" >/dev/null && echo "unpacked $name in $(( $(date +%s) - t )) s" ) &
  wheels[$name]=$dest
done
shift; wait
slot_no=0
for slot in "$@"; do
  slot_no=$((slot_no + 1))
  (
    dir=$out/slot$slot_no; mkdir -p "$dir"
    while read -r profile packname rest; do
      [ -z "$profile" ] && continue
      left=$(( deadline - $(date +%s) ))
      [ "$left" -lt 45 ] && { echo "slot $slot_no: no time left for: $rest" >>"$dir/console.log"; continue; }
      t=$(date +%s)
      echo "=== slot $slot_no: $profile $rest (limit ${left}s, started $(date -u +%T))" >>"$dir/console.log"
      if [ "$profile" = run ]; then  # run NAME COMMAND...
        SLOT_DIR=$dir timeout --signal=INT --kill-after=20 $left bash -c "$rest" >"$dir/$packname.log" 2>&1
        echo "=== run $packname exit $? after $(( $(date +%s) - t )) s" | tee -a "$dir/$packname.log" >>"$dir/console.log"
        continue
      fi
      if [ "$profile" = check ]; then  # check PACKNAME LOCK DAY [--scenario ...]: the day's era overlay, then compat-matrix check
        read -r lock day scen <<<"$rest"
        pins=$(python3 -c "import json,sys; d=json.load(open('matrix/locks/$lock.json'))['days']['$day']['overlay']; print(' '.join(f'{k}=={v}' for k,v in d.items()))")
        ov=/tmp/check-overlay-$slot_no
        python3 -m pip install -q --no-index --no-deps --find-links "${wheels[$packname]}" --target "$ov" $pins >>"$dir/console.log" 2>&1
        echo "=== overlay installed in $(( $(date +%s) - t )) s: $pins" >>"$dir/console.log"
        c=$(date +%s)
        PYTHONPATH=$ov timeout --signal=INT $left python3 -m harness check $scen >"$dir/check-$day.log" 2>&1
        echo "=== check exit $? after $(( $(date +%s) - c )) s" | tee -a "$dir/check-$day.log" >>"$dir/console.log"
        continue
      fi
      run_env=""
      if [[ "$rest" =~ --resume\ ([^ ]+) ]]; then
        run_env="COMPAT_MATRIX_RUN=${BASH_REMATCH[1]}"; rest=${rest/--resume ${BASH_REMATCH[1]}/}
      fi
      eval "$run_env COMPAT_MATRIX_TIME_LIMIT=$left COMPAT_MATRIX_ENVS=/tmp/envs-slot$slot_no scripts/gpu-node-run.sh $profile ${wheels[$packname]} $dir $rest" >>"$dir/console.log" 2>&1
      echo "=== slot $slot_no: exit $? after $(( $(date +%s) - t )) s" >>"$dir/console.log"
    done <"$slot"
  ) &
done
wait
nvidia-smi --query-gpu=name,memory.total --format=csv >"$out/gpus.csv" 2>&1
echo "all slots done at $(date -u +%T)"
# At most 8 files come back from a call: everything in one tarball.
tar czf /tmp/call.tgz -C "$out" . && rm -rf "${out:?}"/* && mv /tmp/call.tgz "$out/call.tgz"
