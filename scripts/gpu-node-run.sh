#!/usr/bin/env bash
# Run a profile on an air-gapped GPU node that has python3 + torch (and hypothesis, packaging) but no uv or nox.
#   scripts/gpu-node-run.sh PROFILE WHEELHOUSE OUTDIR [extra harness args...]
# Cells are layered over the node's own torch from WHEELHOUSE (--system-torch --offline). The run's
# records.jsonl and meta.json are copied flat into OUTDIR as <run-id>.records.jsonl / <run-id>.meta.json,
# plus the worker logs as <run-id>.logs.tgz; `python -m harness import-run OUTDIR/<run-id>.*` files them
# under results/runs/ on the connected machine.
# A run spread over several device calls: COMPAT_MATRIX_RUN=RUN_ID continues that run from the checkout's own
# results/runs/RUN_ID (committed after the earlier calls), so every call adds to one run and nothing repeats;
# pass the call's cells (e.g. --cells 'era_date-2024-0*') after OUTDIR.
set -uo pipefail
profile=$1 wheelhouse=$2 outdir=$3
shift 3
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
resume=()
if [[ -n "${COMPAT_MATRIX_RUN:-}" ]]; then
  results=${COMPAT_MATRIX_RESULTS:-results}
  resume=(--resume "$COMPAT_MATRIX_RUN")
else
  results=${COMPAT_MATRIX_RESULTS:-$(mktemp -d)}
fi
# COMPAT_MATRIX_TIME_LIMIT (seconds): stop cleanly with SIGINT in time to copy what was recorded.
timeout --signal=INT --kill-after=30 "${COMPAT_MATRIX_TIME_LIMIT:-0}" python3 -m harness matrix --profile "$profile" \
  --offline --wheelhouse "$wheelhouse" --system-torch python3 --results-dir "$results" \
  --envs-dir "${COMPAT_MATRIX_ENVS:-/tmp/compat-matrix-envs}" --no-report "${resume[@]}" "$@"
status=$?
mkdir -p "$outdir"
for run in "$results"/runs/*/; do
  id=$(basename "$run")
  [[ -n "${COMPAT_MATRIX_RUN:-}" && "$id" != "$COMPAT_MATRIX_RUN" ]] && continue
  cp "$run/records.jsonl" "$outdir/$id.records.jsonl"
  cp "$run/meta.json" "$outdir/$id.meta.json"
  tar -czf "$outdir/$id.logs.tgz" -C "$run" worker 2>/dev/null || true
done
exit $status
