"""Plain functions for the textstats example: word statistics of a short text.

The example pipeline (``textstats.yaml``, ``textstats_pipeline.py`` and
``textstats_cfg.py`` declare it three ways) is small and has nothing to do with
machine learning on purpose: it shows the parts of flexgraph a training graph
uses, where the order of in-place updaters matters.

``tokens`` is changed in place by several steps (``drop_stopwords``,
``lowercase``, ``strip_punctuation``, ``fold_accents``), and their order changes
the result: stop words are compared in lower case, so dropping them *before*
lowercasing misses "The". The ``lowercase_first`` strategy fixes that by moving
``lowercase`` ahead and inserting ``fold_accents`` after it.

Every function is plain Python; the specs refer to them as ``"textstats:<fn>"``.
"""

from __future__ import annotations

import string
import unicodedata
from collections import Counter

STOPWORDS = frozenset({"a", "an", "and", "in", "is", "it", "of", "on", "the", "to"})

SAMPLE = (
    "The café on the corner is the best café in the town. "
    "The coffee is strong, the cake is sweet, and the Café is never empty."
)


def load_text(document: str) -> str:
    """Normalise line breaks and surrounding space."""
    return " ".join(document.split())


def tokenize(text: str) -> list[str]:
    """Split the text into words."""
    return text.split()


def strip_punctuation(tokens: list[str]) -> list[str]:
    """Strip punctuation from each word (in place) and drop the empty ones."""
    tokens[:] = [t.strip(string.punctuation) for t in tokens if t.strip(string.punctuation)]
    return tokens


def drop_stopwords(tokens: list[str], stopwords: frozenset[str] = STOPWORDS) -> list[str]:
    """Remove stop words (compared as written, so run it after lowercase)."""
    tokens[:] = [t for t in tokens if t not in stopwords]
    return tokens


def lowercase(tokens: list[str]) -> list[str]:
    """Lower-case every word (in place)."""
    tokens[:] = [t.lower() for t in tokens]
    return tokens


def fold_accents(tokens: list[str]) -> list[str]:
    """Fold accented letters to plain ones (café -> cafe), in place."""
    folded = (unicodedata.normalize("NFKD", t) for t in tokens)
    tokens[:] = ["".join(c for c in t if not unicodedata.combining(c)) for t in folded]
    return tokens


def count_words(tokens: list[str]) -> dict[str, int]:
    """Count each word."""
    return dict(Counter(tokens))


def top_words(counts: dict[str, int], n: int = 3) -> list[tuple[str, int]]:
    """The ``n`` most frequent words, ties broken alphabetically."""
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:n]


def report(counts: dict[str, int], top: list[tuple[str, int]]) -> str:
    """One line: how many words, how many distinct, and the top ones."""
    shown = ", ".join(f"{word} ({n})" for word, n in top)
    return f"{sum(counts.values())} words, {len(counts)} distinct; top: {shown}"
