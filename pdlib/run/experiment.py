"""One experiment's untimed set-up: weights, prompts, the engine and the reference traces.

exp = Experiment(RunParams(model="synthetic:tiny", prompt_tokens=300, output_tokens=40, chunk_size=64))
results = exp.validate()        # {policy: ValidationResult}; raises ValidationError on any mismatch
"""

import statistics
from collections.abc import Iterator
from dataclasses import replace

import mlx.core as mx

from pdlib.config import RunParams
from pdlib.engine import Engine
from pdlib.engine.kernels import BACKEND
from pdlib.prompts import make_prompts
from pdlib.run.reference import Reference
from pdlib.run.slo import DEFAULT_TARGET_DECODES, StepCost, calibrate, chunk_rule, cycling_rule, fit_gap, mode_of
from pdlib.run.validate import ReferenceTrace, ValidationResult, validate_policy
from pdlib.scheduler import POLICIES, Prefill, Step, follow, iter_plan, needs_chunk_rule, plan
from pdlib.weights import load_model

REQUESTS = ("A", "B")
# The reference's logits kept per request, so every policy after the first replays them (validate.py):
# Qwen3-0.6B's 1,024 outputs take 622 MB; past this a policy re-runs the reference instead.
KEEP_REFERENCE_LOGITS_BYTES = 1 << 30


class Experiment:
    def __init__(
        self,
        params: RunParams,
        *,
        model=None,
        prune_final_layer: bool = True,
        compile_steps: bool = True,
        traces: dict | None = None,
    ):
        """`traces`: reference traces to share with other experiments on the same weights (a sweep), keyed by
        request and prompt, so the reference runs once for all of them."""
        self.params = p = params
        self.model = model or load_model(p.model)
        p.check_positions(self.model.config)
        self.prompts = make_prompts(
            n_tokens=p.prompt_tokens,
            vocab_size=self.model.config.vocab_size,
            tokenizer=self.model.tokenizer,
            names=REQUESTS,
        )
        self.engine = Engine(
            self.model,
            capacity=p.prompt_tokens + p.output_tokens,
            lossless_decode_weights=p.lossless_decode_weights,
            prune_final_layer=prune_final_layer,
            compile_steps=compile_steps,
        )
        for r in REQUESTS:
            self.engine.add_request(r, self.prompts[r].token_ids)
        self._reference = None
        self._traces = None
        self._shared_traces = {} if traces is None else traces
        self._plans: dict[str, list[Step]] = {}
        self._step_cost: StepCost | None = None
        self._disagg = None  # the prefill worker's session, made when a disagg run first needs it
        self._overlap = None  # the second stream's, for overlap
        self._partition = None  # the SM slices', for partition

    @property
    def traces(self) -> dict[str, ReferenceTrace]:
        """The reference model is built lazily, once; each request's trace follows the engine step by step."""
        if self._traces is None:
            self._traces = {}
            for r in REQUESTS:
                key = (r, self.prompts[r].sha256)
                if key not in self._shared_traces:
                    if self._reference is None:
                        self._reference = Reference(self.model)
                    self._shared_traces[key] = ReferenceTrace(
                        self._reference, self.prompts[r].token_ids, keep_bytes=KEEP_REFERENCE_LOGITS_BYTES
                    )
                self._traces[r] = self._shared_traces[key]
        return self._traces

    def _shape(self, policy: str) -> dict:
        p = self.params
        rule = None
        if needs_chunk_rule(policy):
            rule = chunk_rule(self.step_cost, tbt_slo_ms=self.tbt_slo_ms, ceiling=p.chunk_size, mode=mode_of(policy))
        return dict(
            prompt_tokens=p.prompt_tokens, output_tokens=p.output_tokens, chunk_size=p.chunk_size, chunk_rule=rule
        )

    def plan(self, policy: str) -> list[Step]:
        """The policy's whole step sequence, made once: the gate checks this very list and trials time it."""
        if policy not in self._plans:
            self._plans[policy] = plan(policy, **self._shape(policy))
        return self._plans[policy]

    def walk(self, policy: str) -> Iterator[Step]:
        """The policy deciding live, as a timed run needs it, held to the validated plan step for step
        (a remote-prefill policy: per request, its interleaving depends on timing; pdlib/run/disagg/remote.py)."""
        site = POLICIES[policy].remote_prefill
        if site is not None:
            session = {"stream": self.overlap, "slice": self.partition, "worker": self.disagg}[site]()
            return session.walk(self.plan(policy))
        return follow(iter_plan(policy, **self._shape(policy)), self.plan(policy))

    @property
    def step_cost(self) -> StepCost:
        """The slo policies' cost model, measured on this engine once (untimed, before the gate): the fit,
        then a probe run per mode for what it misses (slo.py)."""
        if self._step_cost is None:
            p = self.params
            self._step_cost = calibrate(
                self.engine, prompt_tokens=p.prompt_tokens, ceiling=p.chunk_size, logical_reset=p.logical_cache_reset
            )
            self._step_cost = self._probe(self._step_cost)
        return self._step_cost

    def _probe(self, cost: StepCost) -> StepCost:
        """Per slo mode, two untimed, unchecked runs like warmups, up to B's first token, of the policy's own
        rounds with chunk sizes cycling through ceiling .. ceiling/8: A's observed gaps across them in the
        second, fitted, become the mode's gap model (slo.fit_gap). Too few to fit: the median of observed
        minus predicted."""
        from pdlib.report.metrics import chunk_gaps
        from pdlib.run.trial import run_once

        p, gap_fit, overhead = self.params, {}, {}
        for q in {mode_of(q): q for q in p.policies if needs_chunk_rule(q)}.values():
            steps = plan(
                q,
                prompt_tokens=p.prompt_tokens,
                output_tokens=p.output_tokens,
                chunk_size=p.chunk_size,
                chunk_rule=cycling_rule(p.chunk_size),
            )
            last = max(i for i, s in enumerate(steps) if any(isinstance(w, Prefill) and w.req == "B" for w in s.work))
            for _ in range(2):  # the first run compiles the mode's step shapes (mixed steps are new here)
                run = run_once(
                    self.engine,
                    q,
                    steps=steps[: last + 1],
                    logical_reset=p.logical_cache_reset,
                    pipeline=p.pipeline_decodes,
                    poll=p.poll_during_chunks,
                )
            chunks = self._chunks(q, steps, cost)
            observed = chunk_gaps([run.to_trial(trial=0, position=0)], chunks)
            # not the first chunk: its gap holds B's reset at t0 (in a mixed step, A's token comes after it)
            rows = [(c, obs) for c, obs in zip(chunks, observed) if c["start"] > 0]
            model = fit_gap([(c["n"], c["start"], o) for c, obs in rows for o in obs])
            if model is not None:
                gap_fit[mode_of(q)] = model
            else:
                residuals = [o - c["predicted_gap_ms"] for c, obs in rows for o in obs]
                overhead[mode_of(q)] = float(statistics.median(residuals)) if residuals else 0.0
        return replace(cost, gap_fit=gap_fit, overhead_ms=overhead)

    @staticmethod
    def _chunks(policy: str, steps: list[Step], cost: StepCost) -> list[dict]:
        """B's chunks in a plan of `policy`, each with its gap as `cost` predicts it."""
        out, start = [], 0
        for w in (w for step in steps for w in step.work if isinstance(w, Prefill) and w.req == "B"):
            out.append({"start": start, "n": w.n, "predicted_gap_ms": cost.gap_ms(w.n, start, mode=mode_of(policy))})
            start += w.n
        return out

    @property
    def tbt_slo_ms(self) -> float:
        """A's gap target for the slo policies: the params', or 5x this device's fitted decode step."""
        p = self.params
        return p.tbt_slo_ms if p.tbt_slo_ms is not None else self.step_cost.default_target_ms()

    def slo_details(self) -> dict | None:
        """For the report: the target, the fit, and per slo policy each chunk's size and predicted gap."""
        policies = [q for q in self.params.policies if needs_chunk_rule(q)]
        if not policies:
            return None
        cost = self.step_cost
        chunks = {q: self._chunks(q, self.plan(q), cost) for q in policies}  # the plans the gate checks
        return {
            "tbt_slo_ms": self.tbt_slo_ms,
            "target_from": "params" if self.params.tbt_slo_ms is not None else f"{DEFAULT_TARGET_DECODES}x decode",
            "ceiling": self.params.chunk_size,
            "cost": cost.to_dict(),
            "chunks": chunks,
        }

    def validate(self, policies=None, *, on_step=None) -> dict[str, ValidationResult]:
        p = self.params
        return {
            policy: validate_policy(
                policy,
                engine=self.engine,
                traces=self.traces,
                steps=self._gate_steps(policy),
                output_tokens=p.output_tokens,
                checkpoint_every=p.validation_checkpoint_every,
                logical_reset=p.logical_cache_reset,
                on_step=on_step,
                pipeline=p.pipeline_decodes,
                poll=p.poll_during_chunks,
            )
            for policy in (policies or p.policies)
        }

    def _gate_steps(self, policy: str):
        """What the gate runs: the plan, or for a remote-prefill policy the same live mechanism a trial runs."""
        return self.walk(policy) if POLICIES[policy].remote_prefill else self.plan(policy)

    def disagg(self):
        if self._disagg is None:
            from pdlib.run.disagg.remote import DisaggSession

            self._disagg = DisaggSession(self.params, prompt_ids=self.prompts["B"].token_ids, config=self.model.config)
        return self._disagg

    def overlap(self):
        if self._overlap is None:
            from pdlib.run.overlap import OverlapSession

            self._overlap = OverlapSession(self.params)
        return self._overlap

    def partition(self):
        if self._partition is None:
            from pdlib.run.partition import PartitionSession

            self._partition = PartitionSession(self.params)
        return self._partition

    def workers(self) -> dict | None:
        """Both workers' devices and the transfer's shape, once a disagg run has used them."""
        return self._disagg.workers if self._disagg else None

    def steps_per_run(self, policy: str) -> int:
        return len(self.plan(policy))

    def describe(self) -> dict:
        return {
            "model": self.model.source,
            "prompts": {r: self.prompts[r].to_dict() for r in REQUESTS},
            "backend": BACKEND,
            "device": str(mx.default_device()),
        }
