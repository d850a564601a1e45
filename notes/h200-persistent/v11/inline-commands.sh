# The twelfth session's inline calls (x2 host after session.sh zx, zy, zz; then one H200), as run.
# 1. The sweep (GPU 0 alone; 261 s) -> sweep/sweep.log, outputs/qwen3-0.6b-h200-sweep/
source .device/boot/boot.sh && export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 && mkdir -p $OUT/logs && \
CUDA_VISIBLE_DEVICES=0 taskset -c 0-15 timeout -s INT 545 python3 -m pdlib sweep --params params/qwen3-0.6b-sweep.yaml \
  --chunk-sizes 32 64 128 256 512 1024 4096 --policies chunked mixed --tbt-slo-ms 22 \
  --reference-policies eager fifo overlap slo-chunked slo-mixed --quiet --output $OUT/sweep > $OUT/logs/sweep.log 2>&1
# 2. gemm_splits twice (GPU 1) -> splits-2-3/; the gemm_sweep beside it never started: the `&` sent the whole
#    `source ... && mkdir ... && ( ... )` chain to the background, so its log's folder did not exist yet
( for i in 2 3; do CUDA_VISIBLE_DEVICES=1 taskset -c 16-31 env SHAPES=1 WEIGHTS=bf16 timeout 120 \
    python3 notes/gpu-session/gemm_splits.py > $OUT/logs/gemm-splits-$i.log 2>&1; done ) &
# 3. gemm_sweep at 4,096 and 128 rows, candidates only (GPU 0; 157 s) -> sweep-4096/
CUDA_VISIBLE_DEVICES=0 taskset -c 0-15 env ROWS="4096 128" EXPLORE=0 timeout 240 python3 notes/gpu-session/gemm_sweep.py \
  > $OUT/logs/gemm-sweep-4096.log 2>&1
# 4. A second machine (one H200, the last ~250 s): check-kernels, then gemm_sweep at 129, 32 and 64 rows, cut by
#    the device budget after the FP32-weight runners at 129 rows -> second-machine/
python3 -m pdlib check-kernels --output $OUT/check-kernels.json > $OUT/ck.log 2>&1
ROWS="129 32 64" EXPLORE=0 python3 notes/gpu-session/gemm_sweep.py > $OUT/sweep-small.log 2>&1
