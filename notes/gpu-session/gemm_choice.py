"""The prefill GEMM to publish with, from session.sh zd's anatomy runs: bf16x3 if its gate passed (the marker
file exists) and its chunk and mixed steps together ran at least 2% faster (medians) than tf32x2's, else tf32x2.

    python3 notes/gpu-session/gemm_choice.py anatomy.log gate-bf16x3.ok > /root/gemm
"""

import json
import os
import statistics
import sys

anatomy, passed = sys.argv[1:3]
runs = [json.loads(line) for line in open(anatomy) if line.startswith("{")]
step = {label: statistics.median(r["chunk_total_ms"] + r["mixed_total_ms"] for r in runs if r["label"] == label)
        for label in ("tf32x2", "bf16x3") if any(r["label"] == label for r in runs)}
faster = "tf32x2" in step and "bf16x3" in step and step["bf16x3"] < 0.98 * step["tf32x2"]
print("bf16x3" if os.path.exists(passed) and faster else "tf32x2")
print(f"chunk + mixed step, medians (ms): {step}", file=sys.stderr)
