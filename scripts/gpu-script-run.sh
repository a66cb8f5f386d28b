#!/usr/bin/env bash
# Run a user's script on a GPU node at several world sizes in one device call.
#
#   scripts/gpu-script-run.sh SCRIPT WHEELS OUT NPROC [NPROC ...]
#
# The wheels in WHEELS (one day's era overlay: `python -m harness wheelhouse --profile gpu-history --day D
# --dest .gpu-wheels`) are layered over the node's own python as a --target overlay; then SCRIPT runs under
# torchrun once per NPROC with `python -m harness run-script` (a timeout after which every rank's Python stacks are
# taken). Each run lands in OUT/<script>-ws<N>.json (outcome, signature, traceback, rank stacks, versions) with its
# log beside it. Example (issue 27, when a 4-GPU kind is lent):
#   scripts/gpu-script-run.sh examples/trainer-fsdp-qlora/recipe.py .gpu-wheels "$OUT" 1 2 4
set -uo pipefail
die() {
    echo "gpu-script-run.sh: $*" >&2
    exit 2
}
if [ $# -lt 4 ]; then
    sed -n '2,12p' "$0" >&2
    exit 2
fi
script=$1 wheels=$2 out=$3
shift 3
[ -f "$script" ] || die "no script $script"
[ -d "$wheels" ] || die "no wheel folder $wheels"
for n in "$@"; do
    [[ "$n" =~ ^[0-9]+$ ]] || die "world size '$n' is not a number"
done
mkdir -p "$out" || die "cannot write $out"
overlay=$(mktemp -d)
python3 -m pip install --quiet --no-deps --target "$overlay" "$wheels"/*.whl || die "cannot install the wheels of $wheels"
name=$(basename "$script" .py)
for n in "$@"; do
    python3 -m harness run-script "$script" --nproc "$n" --torchrun --timeout "${COMPAT_MATRIX_SCRIPT_TIMEOUT:-300}" \
        --pythonpath "$overlay" --json "$out/$name-ws$n.json" 2>&1 | tee "$out/$name-ws$n.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || die "run-script at world size $n failed (see $out/$name-ws$n.log)"
done
