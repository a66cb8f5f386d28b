#!/usr/bin/env bash
# Run a profile on an air-gapped GPU node that has python3 + torch (and hypothesis, packaging) but no uv or nox.
#   scripts/gpu-node-run.sh PROFILE WHEELS OUTDIR [extra harness args...]
# WHEELS is a folder of wheels, or a pack made by `python -m harness wheelhouse --profile P --day D ... --pack F.tar.xz`
# (unpacked here first). Cells are layered over the node's own torch from it (--system-torch --offline). The run's
# records.jsonl and meta.json are copied flat into OUTDIR as <run-id>.records.jsonl / <run-id>.meta.json, plus the
# worker logs as <run-id>.logs.tgz; `python -m harness import-run OUTDIR/<run-id>.records.jsonl` files them under
# results/runs/ on the connected machine.
# A run spread over several device calls: COMPAT_MATRIX_RUN=RUN_ID continues that run from the checkout's own
# results/runs/RUN_ID (committed after the earlier calls), so every call adds to one run and nothing repeats; pass
# the call's cells after OUTDIR, e.g.:  scripts/gpu-node-run.sh gpu-history .gpu-wheels "$OUT" --cell 'era_date-2024-0*'
# COMPAT_MATRIX_TIME_LIMIT (seconds): stop the run cleanly (SIGINT) in time to copy what was recorded.
# SYSTEM_PYTHON: the node's interpreter whose torch the cells run over (default python3).
set -uo pipefail
die() {
    echo "gpu-node-run.sh: $*" >&2
    exit 2
}
if [ $# -lt 3 ]; then
    sed -n '2,13p' "$0" >&2
    exit 2
fi
profile=$1 wheelhouse=$2 outdir=$3
shift 3
[ -f "matrix/$profile.toml" ] || die "no profile matrix/$profile.toml (run from the checkout's root)"
if [ -f "$wheelhouse" ]; then
    unpacked=$(mktemp -d)
    python3 -m harness wheelhouse --unpack "$wheelhouse" --dest "$unpacked" || die "cannot unpack $wheelhouse"
    wheelhouse=$unpacked
fi
[ -d "$wheelhouse" ] || die "no wheel folder or pack at $wheelhouse"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
resume=()
if [[ -n "${COMPAT_MATRIX_RUN:-}" ]]; then
    results=${COMPAT_MATRIX_RESULTS:-results}
    [ -d "$results/runs/$COMPAT_MATRIX_RUN" ] || die "COMPAT_MATRIX_RUN=$COMPAT_MATRIX_RUN: no $results/runs/$COMPAT_MATRIX_RUN"
    resume=(--resume "$COMPAT_MATRIX_RUN")
else
    results=${COMPAT_MATRIX_RESULTS:-$(mktemp -d)}
fi
timeout --signal=INT --kill-after=30 "${COMPAT_MATRIX_TIME_LIMIT:-0}" python3 -m harness matrix --profile "$profile" \
    --offline --wheelhouse "$wheelhouse" --system-torch "${SYSTEM_PYTHON:-python3}" --results-dir "$results" \
    --envs-dir "${COMPAT_MATRIX_ENVS:-/tmp/compat-matrix-envs}" --no-report "${resume[@]}" "$@"
status=$?
[ "$status" -eq 2 ] && die "the harness refused the call (exit 2): see its message above"
mkdir -p "$outdir" || die "cannot write $outdir"
copied=0
for run in "$results"/runs/*/; do
    [ -f "$run/records.jsonl" ] || continue
    id=$(basename "$run")
    [[ -n "${COMPAT_MATRIX_RUN:-}" && "$id" != "$COMPAT_MATRIX_RUN" ]] && continue
    cp "$run/records.jsonl" "$outdir/$id.records.jsonl" || die "cannot copy $run/records.jsonl"
    cp "$run/meta.json" "$outdir/$id.meta.json" || die "cannot copy $run/meta.json"
    tar -czf "$outdir/$id.logs.tgz" -C "$run" worker 2>/dev/null || true
    copied=$((copied + 1))
done
[ "$copied" -gt 0 ] || die "the run wrote no records (harness exit $status)"
exit $status
