"""Product search: BM25 over the same document text WebShop indexes, with the `bm25s` library.

WebShop indexes, per product, `title + description + first bullet point + option text`, lower-cased,
with Lucene (pyserini) BM25 at k1=0.9, b=0.4 and English analysis (stop words, Porter stemming), and
shows the top 50 hits. Here `bm25s` scores with its Lucene variant and the same k1/b; the analyser is a
close stand-in for Lucene's: word tokens (letters/digits, keeping "3.4" and "men's" whole), possessive
"'s" removed, Lucene's English stop words dropped, Porter stemming (PyStemmer). Ties are broken by
catalog order, as Lucene breaks them by document id.
"""
from __future__ import annotations

import os
import re
import sys

import numpy as np
import Stemmer

# bm25s runs a JAX op when it is imported if JAX is installed. On a GPU machine that starts JAX's CUDA
# backend, which takes 75 % of the GPU's memory, and the engine and learner then fail to allocate
# (`CUBLAS_STATUS_ALLOC_FAILED` at the first rollout, seen on an H200 whose image has jax[cuda]).
# This search runs on the CPU: keep JAX there unless the process has imported JAX itself, or the user chose.
if "jax" not in sys.modules:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
import bm25s  # noqa: E402  (after the JAX guard above)

TOP_N = 50
K1, B = 0.9, 0.4
#: Lucene's English stop words (EnglishAnalyzer's default set)
STOP_WORDS = frozenset("a an and are as at be but by for if in into is it no not of on or such that the their "
                       "then there these they this to was will with".split())
_TOKEN = re.compile(r"[a-z0-9]+(?:[.'’][a-z0-9]+)*")
_stemmer = Stemmer.Stemmer("porter")


def split_words(text: str, pattern: re.Pattern = _TOKEN) -> list[str]:
    """Lower-cased word tokens of `text` with a possessive "'s" removed."""
    out = []
    for tok in pattern.findall(text.lower()):
        tok = tok.replace("’", "'")
        out.append(tok[:-2] if tok.endswith("'s") else tok)
    return [t for t in out if t]


def analyze(text: str) -> list[str]:
    """Lower-case, tokenise, drop possessives and stop words, Porter-stem words of three letters or
    more. Porter's own rule leaves one- and two-letter words alone; PyStemmer's port stems "s" to "",
    a token bm25s indexes without a row of scores, so a search for "men s shoes" raised ValueError."""
    words = [t for t in split_words(text) if t not in STOP_WORDS]
    return [w if len(w) <= 2 or not stem else stem for w, stem in zip(words, _stemmer.stemWords(words))]


def document_text(product: dict) -> str:
    """The text WebShop indexes for a product."""
    option_text = ", and ".join(f"{name}: {', '.join(values)}" for name, values in product["options"].items())
    first_bullet = product["BulletPoints"][0] if product["BulletPoints"] else ""
    return " ".join([product["Title"], product["Description"], first_bullet, option_text]).lower()


class ProductSearch:
    """`search(keywords)` → asins of the top `TOP_N` products with a positive BM25 score."""

    def __init__(self, products: list[dict]):
        self.asins = [p["asin"] for p in products]
        self._bm25 = bm25s.BM25(k1=K1, b=B, method="lucene")
        self._bm25.index([analyze(document_text(p)) for p in products], show_progress=False)
        self._cache: dict[str, list[str]] = {}

    def search(self, keywords: str, k: int = TOP_N) -> list[str]:
        key = f"{k}\x00{keywords}"
        hit = self._cache.get(key)
        if hit is None:
            tokens = analyze(keywords)
            if not tokens:
                hit = []
            else:
                scores = np.asarray(self._bm25.get_scores(tokens))
                order = np.argsort(-scores, kind="stable")[:k]
                hit = [self.asins[i] for i in order if scores[i] > 0]
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[key] = hit
        return list(hit)
