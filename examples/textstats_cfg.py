"""Word statistics of a short text, as an MMEngine-style config.

The same pipeline as textstats.yaml and textstats_pipeline.py. mmengine's
``Config`` reads this file, so ``_base_``, ``--cfg-options`` and
``custom_imports`` work as in any OpenMMLab config:

    flexgraph plan examples/textstats_cfg.py
    flexgraph plan examples/textstats_cfg.py --cfg-options strategy=None

``steps`` declares the graph; ``custom_steps`` adds to it, the way a user adds
a step to the standard training graph without touching it. A custom step that
updates an artifact other steps already update must say where it goes
(``after`` / ``before``), or planning stops with an AmbiguousOrderError.
"""

# mmengine imports these (the config's folder is on sys.path), so a typo in a
# module name fails at load time rather than when the step runs.
custom_imports = dict(imports=["textstats"], allow_failed_imports=False)

steps = [
    dict(name="load_text", fn="textstats:load_text", requires="document", provides="text",
         doc="normalise line breaks and surrounding space"),
    dict(name="tokenize", fn="textstats:tokenize", requires="text", provides="tokens",
         doc="split the text into words"),
    dict(name="drop_stopwords", fn="textstats:drop_stopwords", updates="tokens",
         doc="remove stop words (compared as written)"),
    dict(name="lowercase", fn="textstats:lowercase", updates="tokens",
         doc="lower-case every word"),
    dict(name="count_words", fn="textstats:count_words", requires="tokens", provides="counts",
         doc="count each word"),
    dict(name="top_words", fn="textstats:top_words", requires="counts", provides="top",
         params=dict(n=3), doc="the most frequent words"),
    dict(name="report", fn="textstats:report", requires=["counts", "top"], provides="summary",
         doc="one line of statistics"),
]

custom_steps = [
    dict(name="strip_punctuation", fn="textstats:strip_punctuation", updates="tokens",
         after="lowercase", doc="strip punctuation from each word"),
]

strategies = dict(
    lowercase_first=dict(
        doc="compare stop words in lower case, and fold accents (café = cafe)",
        rewrites=[
            dict(move="lowercase", before="drop_stopwords"),
            dict(insert=dict(name="fold_accents", fn="textstats:fold_accents",
                             updates="tokens", doc="fold accented letters to plain ones"),
                 after="lowercase"),
            dict(configure="top_words", params=dict(n=2)),
        ],
    ),
)

strategy = "lowercase_first"

inputs = dict(
    document="The café on the corner is the best café in the town. "
    "The coffee is strong, the cake is sweet, and the Café is never empty.",
)
