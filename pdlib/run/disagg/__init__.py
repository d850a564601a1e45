"""Prefill/decode disaggregation: the `disagg` policy's second worker, over MLX distributed.

    python -m pdlib run --model synthetic:tiny --prompt-tokens 256 --output-tokens 32 --chunk-size 32 \
        --policies chunked disagg --trials 2 --warmups 1 --logical-cache-reset --output /tmp/d.json

The process that runs the experiment is the decode worker (rank 0: A's stream, then B's decodes); it spawns
the prefill worker (rank 1: B's prompt in chunks) the first time a `disagg` run needs it. launch.py: the
worker process, the side channel (pipes) and the distributed group; worker.py: rank 1's loop; transfer.py:
the K/V collective; remote.py: what the executor calls (RemotePrefill) and how a run is validated.
Nothing here is imported unless a `disagg` policy is requested, so other runs stay single-process.
"""
