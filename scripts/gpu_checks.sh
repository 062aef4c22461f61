#!/usr/bin/env bash
# The checks that need a CUDA GPU, run on a machine that has one (python3 with torch there):
# the GPU profile (tensoropt profile on CUDA), the CUDA-marked tests, and real training steps of
# the plans of scripts/validate_device.py (priced beforehand into $PLAN_DIR, default
# data/validation/h100, by `validate_device.py plans --devices 1xGPU --dir $PLAN_DIR`).
# Results go to $OUT (default out/gpu). The validation runs first: it is what a short lease
# must not lose.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$OUT/machine.txt"
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))" \
    2>&1 | tee -a "$OUT/machine.txt"
# ISOLATE=1: every plan in a fresh process (about twice the time; the only clean reserved peaks)
timeout "${VALIDATE_S:-300}" $PY scripts/validate_device.py run ${ISOLATE:+--isolate} --dir "${PLAN_DIR:-data/validation/h100}" --out "$OUT" \
    2>&1 | tee "$OUT/validate.log"
timeout "${PROFILE_S:-180}" $PY -m tensoropt.profile --devices cuda --out "$OUT/profile.json" --no-progress 2>&1 \
    | tee "$OUT/profile.log"
timeout "${TESTS_S:-90}" $PY -m pytest -q -m cuda -p no:cacheprovider tests/test_profile.py 2>&1 \
    | tee "$OUT/pytest_cuda.log"
timeout "${APPLY_S:-200}" torchrun --standalone --nproc-per-node 1 scripts/apply_on_device.py \
    gpt2:none gpt2:full gpt2:op hf-gpt2:op resnet50:full hf-llama:op 2>&1 | grep -v -i warn | tee "$OUT/apply.log"
