"""Distinct, hashed prompts of exactly N tokens, cut from a committed corpus of Python stdlib docstrings.

    from pdlib.prompts import make_prompts
    ps = make_prompts(n_tokens=4096, vocab_size=151_936)                    # byte mapping
    ps = make_prompts(n_tokens=4096, vocab_size=151_936, tokenizer=tok)     # a transformers tokenizer
    ps["A"].token_ids, ps["B"].sha256, ps["B"].to_dict()

    python -m pdlib.prompts                    # print the prompts' summaries for n=4096
    python -m pdlib.prompts --rebuild-corpus   # regenerate pdlib/data/stdlib_docs.txt.gz (changes hashes!)

Corpus (`pdlib/data/stdlib_docs.txt.gz`): UTF-8 text, documents separated by a line holding only a form
feed ("\\f"); each document is a title line (the dotted name, e.g. `json.dumps`) then its docstring. It was
extracted once, so prompts are identical on every machine and Python version; the file, not the
interpreter, is the source of truth.

Prompt rule: the corpus is split into len(names) equal runs of documents; request i walks its own run from
the start, rendering each document as "title\\n\\ntext\\n\\n" and tokenizing it alone, until it has >= N
ids, then truncates to exactly N. Runs never overlap, so requests share no document.
Byte mapping: token id = UTF-8 byte value (0..255). Hash: SHA-256 of the ids as little-endian uint32.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import struct
from dataclasses import dataclass
from pathlib import Path

from pdlib.errors import InputError, check_int

CORPUS_PATH = Path(__file__).parent / "data" / "stdlib_docs.txt.gz"
DOC_SEP = "\n\f\n"  # normalisation removes every other form feed, so this split is unambiguous
BYTE_VOCAB = 256


@dataclass(frozen=True)
class Prompt:
    name: str  # "A" or "B"
    token_ids: tuple[int, ...]
    sha256: str  # token_ids_sha256(token_ids)
    tokenizer: str  # "bytes" or the tokenizer's name_or_path
    source: str  # e.g. "json.JSONDecoder..json.dumps (12 docs)"

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "tokens": len(self.token_ids),
            "sha256": self.sha256,
            "tokenizer": self.tokenizer,
            "source": self.source,
        }


def token_ids_sha256(ids) -> str:
    """Hex SHA-256 of the ids packed as little-endian uint32 (4 bytes per id, no header)."""
    ids = list(ids)
    return hashlib.sha256(struct.pack(f"<{len(ids)}I", *ids)).hexdigest()


@functools.lru_cache(maxsize=1)
def _corpus() -> tuple[tuple[str, str], ...]:
    text = gzip.decompress(CORPUS_PATH.read_bytes()).decode("utf-8")
    return tuple(tuple(d.split("\n", 1)) for d in text.split(DOC_SEP))


def load_corpus() -> list[tuple[str, str]]:
    """The (title, text) documents of the committed corpus, in file order."""
    return list(_corpus())


def byte_tokens(text: str) -> list[int]:
    """The byte-level mapping: the UTF-8 bytes of `text`, token id = byte value (0..255)."""
    return list(text.encode("utf-8"))


def render(title: str, text: str) -> str:
    return f"{title}\n\n{text}\n\n"


def encoder(vocab_size: int, tokenizer=None):
    """(encode, tokenizer name): the byte mapping (needs vocab_size >= 256), or the tokenizer's
    `encode(text, add_special_tokens=False)` with every id checked to lie in [0, vocab_size)."""
    check_int("vocab_size", vocab_size, 1)
    if tokenizer is None:
        if vocab_size < BYTE_VOCAB:
            raise InputError(
                f"vocab_size={vocab_size} is too small for the byte mapping: "
                f"it needs vocab_size >= {BYTE_VOCAB} (or pass a tokenizer)"
            )
        return byte_tokens, "bytes"
    name = str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)

    def encode(text: str) -> list[int]:
        ids = [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]
        bad = [i for i in ids if not 0 <= i < vocab_size]
        if bad:
            raise InputError(
                f"tokenizer {name!r} produced id {bad[0]} outside [0, vocab_size={vocab_size}): "
                "the tokenizer does not match the model's vocab_size"
            )
        return ids

    return encode, name


def make_prompts(*, n_tokens: int, vocab_size: int, tokenizer=None, names=("A", "B")) -> dict[str, Prompt]:
    """One prompt of exactly `n_tokens` ids per name, each from its own run of corpus documents.

    Without `tokenizer`, the byte mapping (needs vocab_size >= 256); with one, its
    `encode(text, add_special_tokens=False)` ids, which must all lie in [0, vocab_size).
    """
    check_int("n_tokens", n_tokens, 1)
    check_int("vocab_size", vocab_size, 1)
    names = tuple(names)
    if not names or len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
        raise InputError(f"names={names!r} is not accepted: need distinct non-empty strings")
    encode, tok_name = encoder(vocab_size, tokenizer)
    docs = _corpus()
    if len(docs) < len(names):
        raise InputError(f"names={names!r}: the corpus has only {len(docs)} documents")
    bounds = [i * len(docs) // len(names) for i in range(len(names) + 1)]
    runs = [docs[a:b] for a, b in zip(bounds, bounds[1:])]
    out = {}
    for name, run in zip(names, runs):
        ids: list[int] = []
        used = 0
        while len(ids) < n_tokens and used < len(run):
            ids += encode(render(*run[used]))
            used += 1
        if len(ids) < n_tokens:
            most = min(sum(len(encode(render(*d))) for d in r) for r in runs)
            raise InputError(
                f"n_tokens={n_tokens} is more than the corpus can give each of {len(names)} "
                f"prompts with tokenizer {tok_name!r}: at most {most} tokens"
            )
        ids = tuple(ids[:n_tokens])
        source = f"{run[0][0]}..{run[used - 1][0]} ({used} docs)"
        out[name] = Prompt(name, ids, token_ids_sha256(ids), tok_name, source)
    return out


# ---- corpus builder: run once, commit the output; everything below is not imported by the prompts ----

# Sorted, fixed list of well-documented stdlib modules (documents come only from objects defined there).
CORPUS_MODULES = sorted(
    """
    argparse asyncio.base_events asyncio.events asyncio.futures asyncio.locks asyncio.queues
    asyncio.streams asyncio.subprocess asyncio.tasks bisect collections concurrent.futures._base
    configparser contextlib csv dataclasses datetime difflib email.message email.parser email.utils enum
    fnmatch functools heapq http.client http.cookiejar http.server inspect itertools json json.decoder
    json.encoder logging logging.handlers pathlib pickle queue random re selectors shlex shutil statistics
    string subprocess tarfile tempfile textwrap threading typing unittest.case unittest.mock urllib.parse
    urllib.request xml.etree.ElementTree zipfile
""".split()
)


def _normalise(doc: str) -> str:
    import inspect
    import re

    text = inspect.cleandoc(doc).replace("\r\n", "\n").replace("\r", "\n")
    text = text.replace("\f", "\n").replace("\v", "\n")
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def build_corpus(*, min_chars: int = 120) -> list[tuple[str, str]]:
    """Extract (dotted name, docstring) for each listed module, its public classes, their public methods
    and properties, and its public functions; sorted by name within a module, duplicates of text dropped."""
    import importlib
    import inspect
    import warnings

    warnings.simplefilter("ignore", DeprecationWarning)  # touching typing.io/typing.re warns on 3.11
    docs, seen = [], set()

    def add(title: str, obj) -> None:
        doc = obj.__doc__ if isinstance(getattr(obj, "__doc__", None), str) else None
        if not doc:
            return
        text = _normalise(doc)
        if len(text) >= min_chars and text not in seen:
            seen.add(text)
            docs.append((title, text))

    for modname in CORPUS_MODULES:
        mod = importlib.import_module(modname)
        add(modname, mod)
        for name, obj in sorted(vars(mod).items()):
            if name.startswith("_") or getattr(obj, "__module__", None) != modname:
                continue
            if inspect.isclass(obj):
                add(f"{modname}.{name}", obj)
                for mname, m in sorted(vars(obj).items()):
                    if not mname.startswith("_"):
                        add(f"{modname}.{name}.{mname}", getattr(m, "__func__", m))
            elif callable(obj):
                add(f"{modname}.{name}", obj)
    return docs


def write_corpus(docs, *, path: Path = CORPUS_PATH) -> None:
    body = DOC_SEP.join(f"{t}\n{x}" for t, x in docs).encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(body, compresslevel=9, mtime=0))  # mtime=0: same bytes on rebuild


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rebuild-corpus", action="store_true", help="re-extract the corpus from this Python")
    ap.add_argument("--n-tokens", type=int, default=4096)
    args = ap.parse_args()
    if args.rebuild_corpus:
        docs = build_corpus()
        write_corpus(docs)
        _corpus.cache_clear()
        print(f"wrote {CORPUS_PATH}: {len(docs)} docs, {sum(len(byte_tokens(render(*d))) for d in docs)} bytes")
    for p in make_prompts(n_tokens=args.n_tokens, vocab_size=BYTE_VOCAB).values():
        print(p.to_dict())
