"""Faults planted in the tests of prefills that run elsewhere (overlap's stream, partition's slice, the serving
lane), so each test shows its check catches them."""

import mlx.core as mx


def plant_prompt_token(monkeypatch, prefill_class, vocab_size: int, index: int) -> None:
    """`prefill_class.start` prefills its request's prompt with token `index` changed (the engine's own copy
    of the prompt is left as it was, so everything else runs the right one)."""
    real = prefill_class.start

    def start(self, engine):
        r = engine.requests[self.req]
        good = r.prompt
        r.prompt = mx.concatenate([good[:index], (good[index : index + 1] + 1) % vocab_size, good[index + 1 :]])
        try:
            real(self, engine)
        finally:
            r.prompt = good

    monkeypatch.setattr(prefill_class, "start", start)
