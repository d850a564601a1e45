"""One experiment's untimed set-up: weights, prompts, the engine and the reference traces.

    exp = Experiment(RunParams(model="synthetic:tiny", prompt_tokens=300, output_tokens=40, chunk_size=64))
    results = exp.validate()        # {policy: ValidationResult}; raises ValidationError on any mismatch
"""

from collections.abc import Iterator

import mlx.core as mx

from pdlib.config import RunParams
from pdlib.engine import Engine
from pdlib.engine.kernels import BACKEND
from pdlib.prompts import make_prompts
from pdlib.reference import Reference
from pdlib.scheduler import POLICIES, Step, follow, iter_plan, plan
from pdlib.validate import ReferenceTrace, ValidationResult, validate_policy
from pdlib.weights import load_model

REQUESTS = ("A", "B")


class Experiment:
    def __init__(self, params: RunParams, *, model=None, prune_final_layer: bool = True, compile_steps: bool = True):
        self.params = p = params
        self.model = model or load_model(p.model)
        p.check_positions(self.model.config)
        self.prompts = make_prompts(n_tokens=p.prompt_tokens, vocab_size=self.model.config.vocab_size,
                                    tokenizer=self.model.tokenizer, names=REQUESTS)
        self.engine = Engine(self.model, capacity=p.prompt_tokens + p.output_tokens,
                             lossless_decode_weights=p.lossless_decode_weights, prune_final_layer=prune_final_layer,
                             compile_steps=compile_steps)
        for r in REQUESTS:
            self.engine.add_request(r, self.prompts[r].token_ids)
        self._reference = None
        self._traces = None
        self._plans: dict[str, list[Step]] = {}
        self._disagg = None  # issue 13: the prefill worker's session, made when a disagg run first needs it

    @property
    def traces(self) -> dict[str, ReferenceTrace]:
        """The reference model is built lazily, once; each request's trace follows the engine step by step."""
        if self._traces is None:
            self._reference = Reference(self.model)
            self._traces = {r: ReferenceTrace(self._reference, self.prompts[r].token_ids) for r in REQUESTS}
        return self._traces

    def plan(self, policy: str) -> list[Step]:
        """The policy's whole step sequence, made once: the gate checks this very list and trials time it."""
        if policy not in self._plans:
            p = self.params
            self._plans[policy] = plan(policy, prompt_tokens=p.prompt_tokens, output_tokens=p.output_tokens,
                                       chunk_size=p.chunk_size)
        return self._plans[policy]

    def walk(self, policy: str) -> Iterator[Step]:
        """The policy deciding live, as a timed run needs it, held to the validated plan step for step
        (a remote-prefill policy: per request, its interleaving depends on timing; pdlib/disagg/remote.py)."""
        p = self.params
        if POLICIES[policy].remote_prefill:  # issue 13
            return self.disagg().walk(self.plan(policy))
        return follow(iter_plan(policy, prompt_tokens=p.prompt_tokens, output_tokens=p.output_tokens,
                                chunk_size=p.chunk_size), self.plan(policy))

    def validate(self, policies=None, *, on_step=None) -> dict[str, ValidationResult]:
        p = self.params
        return {policy: validate_policy(policy, engine=self.engine, traces=self.traces, steps=self._gate_steps(policy),
                                        output_tokens=p.output_tokens, checkpoint_every=p.validation_checkpoint_every,
                                        logical_reset=p.logical_cache_reset, on_step=on_step)
                for policy in (policies or p.policies)}

    # --- issue 13 (disagg) -----------------------------------------------------------------------------
    def _gate_steps(self, policy: str):
        """What the gate runs: the plan, or for a remote-prefill policy the same live mechanism a trial runs."""
        return self.walk(policy) if POLICIES[policy].remote_prefill else self.plan(policy)

    def disagg(self):
        if self._disagg is None:
            from pdlib.disagg.remote import DisaggSession
            self._disagg = DisaggSession(self.params, prompt_ids=self.prompts["B"].token_ids,
                                         config=self.model.config)
        return self._disagg

    def workers(self) -> dict | None:
        """Both workers' devices and the transfer's shape, once a disagg run has used them."""
        return self._disagg.workers if self._disagg else None
    # --- end issue 13 ------------------------------------------------------------------------------------

    def steps_per_run(self, policy: str) -> int:
        return len(self.plan(policy))

    def describe(self) -> dict:
        return {"model": self.model.source, "prompts": {r: self.prompts[r].to_dict() for r in REQUESTS},
                "backend": BACKEND, "device": str(mx.default_device())}
