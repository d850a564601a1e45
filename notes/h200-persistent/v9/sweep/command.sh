# The tenth session's sweep call (x2 host, GPU 0 alone, after zk), as run inline:
source .device/boot/boot.sh && export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 && mkdir -p $OUT/logs && \
CUDA_VISIBLE_DEVICES=0 taskset -c 0-15 env PDLIB_PREFILL_ATTENTION=flash-tf32x3 timeout -s INT 555 \
  python3 -m pdlib sweep --params params/qwen3-0.6b-sweep.yaml --chunk-sizes 32 64 128 256 512 1024 4096 \
  --policies chunked mixed --tbt-slo-ms 22 --reference-policies eager fifo overlap slo-chunked slo-mixed --quiet \
  --output $OUT/sweep > $OUT/logs/sweep.log 2>&1; echo "sweep rc=$?"; tail -n 30 $OUT/logs/sweep.log; \
tar -C $OUT -cf $OUT/sweep.tar sweep logs && rm -r $OUT/sweep $OUT/logs; ls -la $OUT
