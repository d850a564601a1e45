"""Prompts: exact lengths, distinct sources, stable hashes, clear errors."""

import hashlib
import struct

import pytest

from pdlib.errors import InputError
from pdlib.prompts import Prompt, byte_tokens, load_corpus, make_prompts, render, token_ids_sha256

VOCAB = 151_936  # Qwen3's


def _docs_of(p: Prompt, docs) -> set[str]:
    """Titles of the documents a prompt was built from, recovered by re-rendering from its first doc."""
    first, rest = p.source.split("..", 1)
    count = int(rest.rsplit("(", 1)[1].split()[0])
    titles = [t for t, _ in docs]
    i = titles.index(first)
    return set(titles[i : i + count])


def test_corpus_loads_and_is_substantial():
    docs = load_corpus()
    assert len(docs) > 500
    titles = [t for t, _ in docs]
    assert len(set(titles)) == len(titles)
    assert all(t and "\n" not in t and x.strip() for t, x in docs)
    total = sum(len(byte_tokens(render(t, x))) for t, x in docs)
    assert total > 300_000  # two 8192-token BPE prompts need ~70 KB
    assert {"json", "re", "argparse", "pathlib.Path"} <= set(titles)


@pytest.mark.parametrize("n", [1, 7, 300, 4096, 8192])
def test_exact_length_and_distinct(n):
    docs = load_corpus()
    ps = make_prompts(n_tokens=n, vocab_size=256)
    assert set(ps) == {"A", "B"}
    for name, p in ps.items():
        assert p.name == name and p.tokenizer == "bytes"
        assert len(p.token_ids) == n and all(0 <= i < 256 for i in p.token_ids)
        assert p.to_dict() == {"name": name, "tokens": n, "sha256": p.sha256, "tokenizer": "bytes", "source": p.source}
    assert ps["A"].token_ids != ps["B"].token_ids
    assert not _docs_of(ps["A"], docs) & _docs_of(ps["B"], docs)


def test_prompt_is_the_rendered_documents():
    docs = load_corpus()
    a = make_prompts(n_tokens=5000, vocab_size=VOCAB)["A"]
    text = "".join(render(t, x) for t, x in docs[: int(a.source.rsplit("(", 1)[1].split()[0])])
    assert a.token_ids == tuple(text.encode("utf-8")[:5000])


def test_deterministic_and_hash_rule():
    p1 = make_prompts(n_tokens=4096, vocab_size=VOCAB)
    p2 = make_prompts(n_tokens=4096, vocab_size=VOCAB)
    assert p1 == p2
    for p in p1.values():
        ids = p.token_ids
        assert p.sha256 == hashlib.sha256(b"".join(struct.pack("<I", i) for i in ids)).hexdigest()
        changed = (ids[0] + 1,) + ids[1:]
        assert token_ids_sha256(changed) != p.sha256


def test_committed_corpus_is_pinned():
    # Changing the corpus changes every prompt hash in every report; do it on purpose or not at all.
    ps = make_prompts(n_tokens=4096, vocab_size=VOCAB)
    assert ps["A"].sha256 == "b3e538fef2c201f8b2524f7d000928515af420330e1dbe2bca5bf63f89843fdd"
    assert ps["B"].sha256 == "5b1c8368d18fd669854de0da52597dac1436cc680ab23bcdfa3f5eb0c5312e75"


def test_custom_names_split_the_corpus():
    ps = make_prompts(n_tokens=50, vocab_size=256, names=("x", "y", "z"))
    assert list(ps) == ["x", "y", "z"] and len({p.token_ids for p in ps.values()}) == 3


class FakeTokenizer:
    name_or_path = "fake/words"

    def __init__(self, offset=0):
        self.offset, self.calls = offset, 0

    def encode(self, text, add_special_tokens=True):
        assert add_special_tokens is False
        self.calls += 1
        return [self.offset + len(w) % 50 for w in text.split()]


def test_fake_tokenizer_is_used():
    tok = FakeTokenizer()
    ps = make_prompts(n_tokens=777, vocab_size=100, tokenizer=tok)
    assert tok.calls > 0
    for p in ps.values():
        assert p.tokenizer == "fake/words" and len(p.token_ids) == 777
        assert max(p.token_ids) < 50
    assert ps["A"].token_ids != ps["B"].token_ids


def test_tokenizer_ids_outside_vocab_raise():
    with pytest.raises(InputError, match="vocab_size=100"):
        make_prompts(n_tokens=10, vocab_size=100, tokenizer=FakeTokenizer(offset=100))


@pytest.mark.parametrize("n", [0, -1, 2.5, True, "8"])
def test_bad_n_tokens(n):
    with pytest.raises(InputError, match=r"n_tokens must be an integer >= 1, got"):
        make_prompts(n_tokens=n, vocab_size=VOCAB)


def test_n_tokens_beyond_corpus():
    with pytest.raises(InputError, match=r"n_tokens=100000000 .* at most \d+ tokens"):
        make_prompts(n_tokens=100_000_000, vocab_size=VOCAB)


def test_byte_mapping_needs_256():
    with pytest.raises(InputError, match=r"vocab_size=100 .*256"):
        make_prompts(n_tokens=10, vocab_size=100)


def test_bad_names():
    with pytest.raises(InputError, match="names"):
        make_prompts(n_tokens=10, vocab_size=256, names=("A", "A"))


def test_real_bpe_tokenizer_offline():
    # A real transformers fast tokenizer, trained here on the corpus itself (no downloads).
    pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    from transformers import PreTrainedTokenizerFast

    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["[UNK]"],
        show_progress=False,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([x for _, x in load_corpus()[:100]], trainer=trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok)
    ps = make_prompts(n_tokens=8192, vocab_size=600, tokenizer=hf)
    assert all(len(p.token_ids) == 8192 and max(p.token_ids) < 600 for p in ps.values())
    assert ps == make_prompts(n_tokens=8192, vocab_size=600, tokenizer=hf)
    with pytest.raises(InputError, match="vocab_size=300"):
        make_prompts(n_tokens=10, vocab_size=300, tokenizer=hf)
