#!/usr/bin/env bash
# The GPU checks as one script, for a lent CUDA machine that has torch but no network: the CUDA
# tests, `ensdiag bench --device cuda` for the MLP (with strategies and tracking) and ResNet-18,
# then the README's main job on the GPU. Records and logs go to $OUT.
#
#     OUT=/tmp/device-check bash benchmarks/device_check.sh
set -uo pipefail
OUT=${OUT:-/tmp/device-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" -m gpu \
    tests/test_bench.py tests/test_cli_misc.py tests/test_gpu_paths.py 2>&1 | tail -6
timeout 150 python3 -m ensdiag bench --device cuda --strategies --tracking --results-dir "$OUT" 2>&1 | tail -45
timeout 150 python3 -m ensdiag bench --arch resnet18 --device cuda --strategies --results-dir "$OUT" 2>&1 | tail -30
start=$(date +%s)
timeout 120 python3 -m ensdiag train --out /tmp/demo >"$OUT/main-job-train.log" 2>&1; echo "train exit $?"
timeout 60 python3 -m ensdiag report /tmp/demo --format summary 2>&1 | tail -12
echo "main job on cuda: $(( $(date +%s) - start )) s"
