"""The report's JSON schema (version 1), in one place: the trial runner writes it, analysis reads it.

A report is one JSON object:

    {
      "schema": "pdlib.report/1",
      "created_utc": "2026-11-29T10:00:00Z",
      "params": {model, prompt_tokens, output_tokens, chunk_size, policies: [..], trials, warmups,
                 logical_cache_reset, lossless_decode_weights, validation_checkpoint_every,
                 stall_threshold_ms, tbt_slo_ms, pipeline_decodes, poll_during_chunks},
                                                   # exactly config.RunParams.to_dict(); the weights'
                                                   # seed is in "model"
      "model": {"spec": "synthetic:tiny@0", "source": "synthetic" | "checkpoint", "preset": "tiny",
                "seed": 0, "path": null | "/abs/dir", "revision": null | "sha", "config": {...}},
      "prompts": {"A": {"tokens": 4096, "sha256": "..", "tokenizer": "bytes" | "<name>"}, "B": {...}},
      "environment": {"device": "cpu" | "gpu", "device_name": "..", "backend": "cpu" | "cuda" | "metal",
                      "mlx": "0.32.4", "mlx_lm": "..", "python": "3.11.7", "platform": "..",
                      "git_commit": null | "..", "cpu_cores": "16 of 32",
                      "CUDA_VISIBLE_DEVICES": ".." (only when set), "decode": "persistent" | "kernels",
                      "prefill_matmuls": "tf32x2" | "tf32x3" | "bf16x3" | "wgmma" | "fp32",
                      "prefill_attention": "flash-tf32x3" | "flash" | "ops" (what ran; older reports lack them),
                      "prefill_split_sums": "fused" | "ops" | "fused-norm" (with the matmul kernels),
                      "prefill_qk": "kernel" | "ops" (with flash; older reports lack both),
                      "step_dispatch": "layers" | "step" (how a step with a prompt chunk was dispatched:
                                       engine.DISPATCH_ENV; older reports lack it),
                      "token_read": "item" | "mailbox" (how the host read a decode's token: PDLIB_TOKEN_READ;
                                    older reports lack it),
                      "pair_decode": "pair" | "each" (a step of two decodes as one persistent launch or one
                                     launch each: PDLIB_PAIR_DECODE; older reports lack it),
                      "decode_round": "each" | "step" | "compiled" (a step of three or more decodes as one
                                      launch each, one ragged step, or that step compiled: PDLIB_DECODE_ROUND;
                                      older reports lack it),
                      "round_pairs": int | null (the largest round run as pair launches: PDLIB_ROUND_PAIRS;
                                     null where pairs do not run; older reports lack it),
                      "round_group": int | null (the most decodes of such a round in one launch:
                                     PDLIB_ROUND_GROUP, at most what the kernel fits; older reports lack it),
                      "round_gemm": "mlx" | "tiles16" (a few rows' matmuls: PDLIB_ROUND_GEMM; older reports
                                    lack it),
                      "settings": {"PDLIB_DECODE": .., ...} (every engine switch's effective value,
                                   settings.ENGINE; older reports lack it)},
      "sources": {"pdlib/engine/model.py": "<sha256>", ..., "params_file": null | "<sha256>"},
      "validation": {"<policy>": <validate.ValidationResult.to_dict()>, ...},
      "reference_tokens": {"A": [..output ids..], "B": [..]},
      "trials": [
        {"policy": "eager", "trial": 1, "position": 0,       # trial number (1-based), place in that
                                                             # trial's policy order (0-based)
         "peer": true, "agreement": {"A": n, "B": n},        # only on a peer's trials (below)
         "makespan_ns": 51750000000,
         "requests": {
            "A": {"output_ids": [...],   # every output id, A's untimed first token included
                  "timed_from": 1,       # output_ids[timed_from:] are timed
                  "emit_ns": [...]},     # host emission time of each timed output, ns since t0
            "B": {"output_ids": [...], "timed_from": 0, "emit_ns": [...]}},
         "events": [ {"kind": "reset" | "prefill" | "decode", "req": "A" | "B",
                      "start": int, "stop": int,   # prefill: prompt positions [start, stop);
                                                   # decode: cache position written, stop = start + 1;
                                                   # reset: 0, 0
                      "t_start_ns": int, "t_end_ns": int,     # ns since t0, in order
                      "t_issued_ns": int,   # the host had issued the step (its engine call returned)
                      "t_wait_ns": int,     # the host began waiting for its outputs; t_start <=
                                            # t_issued <= t_wait <= t_end. Both absent in older
                                            # reports and on reset, transfer and remote events
                      "cpu_issue_ns": int}, ...]}   # of t_issued - t_start, the host thread's CPU time
                                                    # (absent where t_issued_ns is absent, and in older
                                                    # reports)
      ]
    }

B's prompt run elsewhere (disagg, overlap, partition): its one prefill event carries "remote": true and
"site": "worker" (disagg: from the prefill worker's signal to the decode worker seeing its "ready"), "stream"
(overlap: from its dispatch on the second stream to the waiter seeing it done) or "slice" (partition: the same
on B's slice of the SMs, with "split": whether the SMs were split, "a_sms" and "b_sms": each slice's SMs,
null without a split). Disagg adds a "transfer" event
(req B, start 0, stop = prompt tokens) with "bytes" and "mode", spanning the collective on the decode worker;
environment["workers"] names both workers' devices (and each one's CUDA_VISIBLE_DEVICES), the backend
(ring | nccl), the transfer mode and the prefill worker's chunk ("prefill_chunk", tokens).

With trials, a top-level "solo": {"a_decode_ms", "a_decode_steps", "b_prefill_s", "b_prefill_repeats"}: A's
median decode step and B's median whole-prompt prefill (to its first token), each alone on the device, measured
after the gate and before the trials (run/solo.py; older reports lack it).

With an slo policy, a top-level "slo": {"tbt_slo_ms", "target_from": "params" | "5x decode", "ceiling",
"cost": slo.StepCost.to_dict(), "chunks": {policy: [{"start", "n", "predicted_gap_ms"}, ...]}}.

All times are integer nanoseconds relative to t0 (the instant A is ready for its next decode and B arrives).
A's first timed token has a gap measured from t0 (its "initial resumption gap"); every later gap is the
difference of consecutive emission times. Warmups are not in the report (they are untimed; the runner holds
each to reference_tokens by the same rule as a trial, and stops before any report is written if one differs).

What a report claims, checked when it is read (report/checks.py, InputError naming the first problem):
- a policy with trials passed its gate: validation[policy]["passed"] is true;
- its trials ran what the gate validated: every trial's output_ids, per request, equal reference_tokens
  exactly (and reference_tokens equal validation[policy]["tokens"], where recorded);
- every event lies inside its trial, in clock order: 0 <= t_start_ns <= t_end_ns <= makespan_ns.
A peer (a system timed on the same workload but never gated, such as mlx-lm's own batching) marks each of
its trials "peer": true and has no validation entry; instead of equalling the reference, each trial carries
"agreement": {"A": n, "B": n}, how many leading output ids equal reference_tokens (A's untimed first output
included). A policy's trials are all peer or none.
"""

SCHEMA = "pdlib.report/1"
SWEEP_SCHEMA = "pdlib.sweep/1"  # a sweep folder's index.json: see pdlib/run/sweep.py
REQUESTS = ("A", "B")
EVENT_KINDS = ("reset", "prefill", "decode", "transfer")
TOP_LEVEL_KEYS = (
    "schema",
    "created_utc",
    "params",
    "model",
    "prompts",
    "environment",
    "sources",
    "validation",
    "reference_tokens",
    "trials",
)
SWEEP_INDEX = "index.json"  # a sweep folder's index; each point's report is named by sweep_report_name


def sweep_report_name(policy: str, chunk_size: int) -> str:
    """`chunked-c0128.json`: zero-padded so a folder listing sorts by chunk size within a policy."""
    return f"{policy}-c{chunk_size:04d}.json"
