# The inline call that produced this folder (run from the repository root on the x2 host, after session.sh zt):
# the chunk step's anatomy at 4K with PDLIB_PREFILL_GEMM fp32 and tf32x3, three times each, alternating (GPU 0)
# beside bench-step without peers at 4K with each (GPU 1), then gemm_sweep.py (GPU 1).
source .device/boot/boot.sh; export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1; L=$OUT/logs; mkdir -p $L
( for i in 1 2 3; do for g in fp32 tf32x3; do PDLIB_PREFILL_GEMM=$g LABEL=$g CUDA_VISIBLE_DEVICES=0 taskset -c 0-15 \
    timeout 90 python3 notes/gpu-session/chunk_anatomy.py 4096 >> $L/anatomy.log 2>&1; done; done ) &
( for g in fp32 tf32x3; do PDLIB_PREFILL_GEMM=$g CUDA_VISIBLE_DEVICES=1 taskset -c 16-31 timeout 130 \
    python3 -m pdlib bench-step --no-peers --contexts 4096 --output $L/bench-$g.json > $L/bench-$g.log 2>&1; done
  CUDA_VISIBLE_DEVICES=1 taskset -c 16-31 timeout 100 python3 notes/gpu-session/gemm_sweep.py > $L/gemm-sweep.log 2>&1 ) &
wait
