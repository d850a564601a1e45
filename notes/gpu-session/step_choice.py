"""Which of two settings to publish with, from alternating chunk_anatomy.py runs labelled with them: NEW if its
check passed (the marker file exists) and its chunk and mixed steps together ran faster than BASE's (medians,
times `margin`), else BASE. gemm_choice.py was this for zd, with a 2% margin.

    python3 notes/gpu-session/step_choice.py anatomy.log qk.ok ops kernel [margin] > /root/qk
"""

import json
import os
import statistics
import sys

anatomy, passed, base, new = sys.argv[1:5]
margin = float(sys.argv[5]) if len(sys.argv) > 5 else 1.0
runs = [json.loads(line) for line in open(anatomy) if line.startswith("{")]
step = {label: statistics.median(r["chunk_total_ms"] + r["mixed_total_ms"] for r in runs if r["label"] == label)
        for label in (base, new) if any(r["label"] == label for r in runs)}
faster = base in step and new in step and step[new] < margin * step[base]
print(new if os.path.exists(passed) and faster else base)
print(f"chunk + mixed step, medians (ms): {step}", file=sys.stderr)
