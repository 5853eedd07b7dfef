#!/usr/bin/env bash
# The GPU path, run on a machine with CUDA: the paper's MNIST / Fashion-MNIST / w8a SLATE runs on
# the GPU and the same MNIST run on the same machine's CPU, for the speed-up. Usage:
#   DATA=/path/to/data OUT=/tmp/gpu bash benchmarks/gpu_check.sh
set -uo pipefail
DATA=${DATA:-../shared/data}
OUT=${OUT:-/tmp/slate-gpu}
export PYTHONPATH=${PYTHONPATH:-src} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
lscpu | grep -E '^Model name|^CPU\(s\)'
run() { local name=$1; shift; /usr/bin/time -f "$name wall %e s, peak RSS %M KB" \
  python3 -m slate train --no-progress --out "$OUT/$name" "$@" 2>&1 | grep -E 'test AP|wall|error'; }
run mnist-cuda --dataset mnist --data-dir "$DATA" --device cuda
run mnist-cpu-2threads --dataset mnist --data-dir "$DATA" --device cpu --threads 2
run mnist-cpu-16threads --dataset mnist --data-dir "$DATA" --device cpu --threads 16
run fashion-mnist-cuda --dataset fashion-mnist --data-dir "$DATA" --device cuda
run w8a-cuda --dataset w8a --data-dir "$DATA" --device cuda
run mnist-slate-m-cuda --dataset mnist --data-dir "$DATA" --device cuda --algorithm slate-m
python3 - "$OUT" <<'PY'
import json, sys, pathlib
for p in sorted(pathlib.Path(sys.argv[1]).glob("*/summary.json")):
    s = json.loads(p.read_text())
    print(f"{p.parent.name:24s} AP {s['test_ap']:.4f}  train+eval {s['wall_seconds']:.1f} s  {s['device']}")
PY
