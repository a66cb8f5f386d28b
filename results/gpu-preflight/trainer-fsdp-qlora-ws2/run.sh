#!/usr/bin/env bash
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --target /tmp/ov .gpu-wheels/*.whl || exit 1
export PYTHONPATH=/tmp/ov
nvidia-smi -L; python3 -c "import torch,transformers,peft,accelerate,bitsandbytes as b;print(torch.__version__, torch.cuda.device_count(), transformers.__version__, peft.__version__, accelerate.__version__, b.__version__)"
i=0
for v in "$@"; do
  i=$((i+1)); python3 .scratch/hang/launch.py "$v" /tmp/res/r$i ${T:-75} &
  sleep 1
done
wait
for d in /tmp/res/r*; do echo "== $d"; grep -h "REPRO" $d/logs/*/attempt_0/*/stderr.log 2>/dev/null | cut -c1-250; grep -h -E "Error|error:" $d/logs/*/attempt_0/*/stderr.log | grep -v Warning | tail -3 | cut -c1-300; done
tar -czf $OUT/hang.tgz -C /tmp/res .
