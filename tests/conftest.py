"""Settings for the whole suite.

Property tests draw the same examples on every run (``derandomize``), so that
the suite cannot fail by chance: a run fails only where the code changed.
``HYPOTHESIS_PROFILE=explore`` draws new examples each time, to hunt for bugs;
a failure prints the example to add with ``@example``.
"""

import os

from hypothesis import settings

settings.register_profile("repeatable", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))
