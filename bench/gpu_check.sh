#!/usr/bin/env bash
# GPU check: one prepared script for a CUDA machine (checks < 5 minutes, environment setup not counted).
#
#   bash bench/gpu_check.sh            # from the repo root, on a machine with an NVIDIA GPU
#
# 1. memprobe on tiny_gpt sized to run out of GPU memory (2M tokens a step: > 140 GB of activations),
#    each trial a fresh process: boundary (pow2 grid), whole-step breakdown + CUDA snapshot, remedies.
# 2. CUDA checkpoint/resume equivalence: N steps vs M steps + a new process restoring to N.
# 3. The async-save training-thread stall vs a synchronous torch.save of the same state.
# 3b. The same two for an FSDP2-sharded model (a one-rank group on NCCL, saved through DCP): the resume
#    bitwise from a new process, and the stall against a blocking dcp.save and a bare copy of the shards.
# (4. bench/ckpt.py --device cuda, when that benchmark has a --device flag and time is left.)
# Everything lands in one folder: $OUT if set, else bench/out/gpu/ (summary.txt first).
#
# Environment: reuses .venv-gpu if its torch sees CUDA; else creates it (python3 -m venv .venv-gpu &&
# pip install -e '.[train]': on a CUDA machine `pip install torch` gets a CUDA build).
# Knobs: GPU_CHECK_PY=/path/to/python (use that interpreter, with the repository on PYTHONPATH; on a
# machine with no package index, carry gpukit's missing dependencies as wheels and put them on PYTHONPATH
# too), GPU_CHECK_DEVICE=cpu (a small dry run of the same steps on the CPU, with a memory limit so memprobe
# still sees OOMs), GPU_CHECK_BUDGET_S=330, MEMPROBE_MAX_S=150 (memprobe's share),
# MEMPROBE_SIZES='{batch_size: ..., seq_len: ...}' (tiny_gpt config).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
OUT=${OUT:-bench/out/gpu}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
DEVICE=${GPU_CHECK_DEVICE:-cuda}
BUDGET=${GPU_CHECK_BUDGET_S:-330}
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
rm -f "$OUT"/memprobe.json "$OUT"/resume*.json "$OUT"/stall*.json "$OUT"/*.snapshot.pickle  # no stale figures
say() { echo "$*" | tee -a "$SUMMARY"; }

# -- environment (not counted in the budget) -----------------------------------------------------
t_setup=$SECONDS
PY=${GPU_CHECK_PY:-}
if [ -z "$PY" ]; then
  PY="$ROOT/.venv-gpu/bin/python"
  probe_torch='import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)'
  [ "$DEVICE" = cpu ] && probe_torch='import torch'
  if ! { [ -x "$PY" ] && "$PY" -c "$probe_torch" 2>/dev/null && "$PY" -c 'import glue.cli' 2>/dev/null; }; then
    echo "setting up .venv-gpu (pip install -e '.[train]') ..."
    python3 -m venv "$ROOT/.venv-gpu"
    "$PY" -m pip install -q --upgrade pip >"$OUT/setup.log" 2>&1 || true
    "$PY" -m pip install -q -e '.[train]' >>"$OUT/setup.log" 2>&1 || { tail -20 "$OUT/setup.log"; exit 2; }
  fi
fi
if [ "$DEVICE" = cuda ] && ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)'; then
  say "FAIL: torch in $PY does not see a CUDA device ($("$PY" -c 'import torch; print(torch.__version__)' 2>&1))"
  exit 2
fi
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || true
  "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
} >"$OUT/env.txt" 2>&1 || true
say "gpu_check on $DEVICE: $(tail -n +3 "$OUT/env.txt" | tr '\n' ' ')"
say "setup: $((SECONDS - t_setup)) s (not in the budget); budget for the checks: $BUDGET s"

START=$SECONDS
left() { echo $((BUDGET - (SECONDS - START))); }
FAILED=0
step() {  # step NAME MAX_SECONDS CMD... : run with a deadline, record rc and seconds
  local name=$1 max=$2; shift 2
  local l; l=$(left)
  [ "$max" -gt "$l" ] && max=$l
  if [ "$max" -lt 10 ]; then say "$name: SKIPPED (budget spent)"; FAILED=1; return 0; fi
  local t=$SECONDS rc=0
  timeout --kill-after=5 "$max" "$@" >"$OUT/$name.txt" 2>"$OUT/$name.log" || rc=$?
  say "$name: rc=$rc in $((SECONDS - t)) s (limit $max s)$([ $rc = 124 ] && echo ' TIMED OUT')"
  [ $rc = 0 ] || FAILED=1
}

# -- 1. memprobe: tiny_gpt sized to run out of GPU memory ------------------------------------------
if [ "$DEVICE" = cuda ]; then
  SIZES="{batch_size: 2048, seq_len: 1024, d_model: 256, n_layer: 4, n_head: 4, dropout: 0.1, steps: 100}"
  MP_ARGS=(--device cuda --range 256:8192 --grid pow2 --trial-steps 2 --accept-steps 5 --trial-timeout 90)
else
  SIZES="{batch_size: 64, seq_len: 128, d_model: 64, n_layer: 2, steps: 100}"
  MP_ARGS=(--device cpu --memory-limit-mb 450 --range 8:128 --grid pow2 --trial-steps 1 --accept-steps 4
           --trial-timeout 120)
fi
cat >"$OUT/tiny_gpt_oom.yaml" <<EOF
# tiny_gpt sized so one step does not fit: memprobe's input for this check
command: [python, -m, glue.examples.tiny_gpt]
config: ${MEMPROBE_SIZES:-$SIZES}
outputs: {destination: "s3://gpukit/runs/{run}/outputs"}
checkpoint: {target: "s3://gpukit/runs/{run}"}
EOF
step memprobe "${MEMPROBE_MAX_S:-150}" "$PY" -m glue.cli memprobe --config "$OUT/tiny_gpt_oom.yaml" "${MP_ARGS[@]}" \
  --out "$OUT/memprobe.json"
if [ -f "$OUT/memprobe.json" ]; then
  "$PY" - "$OUT/memprobe.json" <<'EOF' | tee -a "$SUMMARY" || true
import json, sys
r = json.load(open(sys.argv[1]))
if not r.get("complete", True):
    print("  memprobe report is PARTIAL (stopped before the end)")
if not r.get("searches"):
    sys.exit("  memprobe: no search finished")
s = r["searches"][0]
print(f"  boundary {s['vary']}: largest fit {s['largest_fit']}, smallest fail {s['smallest_fail']} "
      f"({s['trial_count']} trials, bound {s['trial_bound']})")
for line in r.get("findings", []):
    print("  " + line)
if s["smallest_fail"] is None:
    print("  WARNING: nothing ran out of memory: raise MEMPROBE_SIZES")
EOF
fi

# -- 2. checkpoint/resume equivalence on the device (plain, then FSDP2-sharded through DCP) ---------------
if [ "$DEVICE" = cuda ]; then
  RES_ARGS=(--steps 40 --split 20 --batch-size 32 --seq-len 256 --d-model 256 --n-layer 4 --n-head 4)
else
  RES_ARGS=(--steps 12 --split 6)
fi
for parallel in ddp fsdp; do
  name=$([ $parallel = ddp ] && echo resume || echo resume_fsdp)
  step "$name" 60 "$PY" bench/gpu_check.py resume --device "$DEVICE" --out "$OUT" --parallel "$parallel" "${RES_ARGS[@]}"
  [ -f "$OUT/$name.json" ] && "$PY" -c "
import json; r = json.load(open('$OUT/$name.json'))
print('  $name', 'OK' if r['ok'] else 'FAILED', {k: r.get(k) for k in ('resumed_from', 'first_resumed_step',
      'max_abs_loss_diff_after_resume', 'max_abs_param_diff', 'bitwise', 'error')})" | tee -a "$SUMMARY" || true
done

# -- 3. async-save stall vs a synchronous save (torch.save; sharded: dcp.save) ---------------------------
SIZE_MB=$([ "$DEVICE" = cuda ] && echo 512 || echo 64)  # 2048 MB took > 45 s a check on an H200 VM (disk-bound)
for parallel in ddp fsdp; do
  name=$([ $parallel = ddp ] && echo stall || echo stall_fsdp)
  step "$name" 60 "$PY" bench/gpu_check.py stall --device "$DEVICE" --size-mb "$SIZE_MB" --out "$OUT" --parallel "$parallel"
  [ -f "$OUT/$name.json" ] && "$PY" -c "
import json; r = json.load(open('$OUT/$name.json'))
print(f\"  $name: {r['state_mb']} MB state: async save blocks {r['async_save_stall_s']*1e3:.0f} ms, sync \"
      f\"{r['sync_baseline']} {r['sync_torch_save_s']*1e3:.0f} ms ({r['sync_over_async']}x), bare host copy \"
      f\"{r['bare_host_copy_s']*1e3:.0f} ms (async {r['async_over_bare_copy']}x of it)\")
" | tee -a "$SUMMARY" || true
done

# -- 4. the checkpoint benchmark, when it knows about devices ---------------------------------------
if [ -f bench/ckpt.py ] && "$PY" bench/ckpt.py --help 2>/dev/null | grep -q -- '--device'; then
  if [ "$(left)" -ge 40 ]; then
    extra=()
    "$PY" bench/ckpt.py --help 2>/dev/null | grep -q -- '--no-fuse' && extra+=(--no-fuse)
    step ckpt_bench "$(left)" "$PY" bench/ckpt.py --device "$DEVICE" --size-mb 512 "${extra[@]}"
  else
    say "ckpt_bench: skipped ($(left) s left)"
  fi
else
  say "ckpt_bench: skipped (bench/ckpt.py has no --device flag; the stall figure above is measured inline)"
fi

say "checks: $((SECONDS - START)) s of $BUDGET s; $([ $FAILED = 0 ] && echo ALL OK || echo SOME FAILED); tables in $OUT"
exit $FAILED
