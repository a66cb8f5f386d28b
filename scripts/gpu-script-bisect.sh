#!/usr/bin/env bash
# One round of `bisect-script --device cuda` on an air-gapped GPU node.
#
#   scripts/gpu-script-bisect.sh FOLDER PACK OUT
#
# FOLDER is the verdict folder the connected machine planned the round in (results/script-bisect/<name>: its
# node-plan.json travels with the tree), PACK the round's wheel pack it wrote (carry it). The node's own python and
# torch run the script (SYSTEM_PYTHON, default python3); each planned stack is an overlay of its wheels over it.
# The runs land in OUT/<name>/ (runs.jsonl, call.json): bring that folder back and pass it to
#   compat-matrix bisect-script SCRIPT --device cuda ... --node-runs OUT/<name>
# COMPAT_MATRIX_TIME_LIMIT (seconds, default 540): the round stops starting runs in time to hand its runs back.
set -uo pipefail
die() {
    echo "gpu-script-bisect.sh: $*" >&2
    exit 2
}
if [ $# -ne 3 ]; then
    sed -n '2,12p' "$0" >&2
    exit 2
fi
folder=$1 pack=$2 out=$3
[ -f "$folder/node-plan.json" ] || die "no $folder/node-plan.json (plan the round with bisect-script --device cuda)"
[ -e "$pack" ] || die "no wheel pack $pack"
mkdir -p "$out" || die "cannot write $out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m harness bisect-script-node "$folder" --wheels "$pack" --out "$out" \
    --python "${SYSTEM_PYTHON:-python3}" --time-limit "${COMPAT_MATRIX_TIME_LIMIT:-540}"
