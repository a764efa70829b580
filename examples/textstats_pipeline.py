"""Word statistics of a short text, with flexgraph's Python API.

The same pipeline as textstats.yaml and textstats_cfg.py. ``flexgraph.step``
turns each plain function of ``textstats`` into a step (used here as a call,
since the functions live in their own module; ``@flexgraph.step(...)`` on a
``def`` does the same). Run it to print the plan and execute it:

    python examples/textstats_pipeline.py

or plan it like any spec: ``flexgraph plan examples/textstats_pipeline.py``.
"""

from __future__ import annotations

import textstats as ts

import flexgraph
from flexgraph import Configure, Graph, Insert, Move, Strategy

# ``requires`` defaults to the function's parameters without defaults.
load_text = flexgraph.step(ts.load_text, provides="text")
tokenize = flexgraph.step(ts.tokenize, provides="tokens")
drop_stopwords = flexgraph.step(ts.drop_stopwords, updates="tokens")
lowercase = flexgraph.step(ts.lowercase, updates="tokens")
count_words = flexgraph.step(ts.count_words, provides="counts")
top_words = flexgraph.step(ts.top_words, provides="top", params={"n": 3})
report = flexgraph.step(ts.report, provides="summary")
strip_punctuation = flexgraph.step(ts.strip_punctuation, updates="tokens", after="lowercase")
fold_accents = flexgraph.step(ts.fold_accents, updates="tokens")  # the strategy inserts it


# Declared together, the three updaters of ``tokens`` chain in list order
# (strip_punctuation says after=lowercase, which that order already keeps).
pipeline = Graph.of(
    [load_text, tokenize, drop_stopwords, lowercase, count_words, top_words, report,
     strip_punctuation],
)

strategies = {
    "lowercase_first": Strategy(
        "lowercase_first",
        [
            Move("lowercase", before="drop_stopwords"),
            Insert(fold_accents, after="lowercase"),
            Configure("top_words", {"n": 2}),
        ],
        doc="compare stop words in lower case, and fold accents (café = cafe)",
    ),
}

strategy = "lowercase_first"

inputs = {"document": ts.SAMPLE}


if __name__ == "__main__":
    plan = flexgraph.make_plan(pipeline.with_inputs(*inputs), strategies[strategy])
    print("order:", " -> ".join(plan.order))
    result = flexgraph.Executor().run(plan, inputs)
    print(result.context["summary"])
