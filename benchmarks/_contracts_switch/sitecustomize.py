"""For benchmarks/contracts.py only: ``FLEXGRAPH_BENCH_CONTRACTS`` switches the contracts.

On the benchmark's ``PYTHONPATH`` in every mode, so all start alike. ``off``:
the executor's contract check does nothing; ``timed``: it runs, and prints
``contracts-seconds S`` (this process's total so far) after each call.
"""

import os

MODE = os.environ.get("FLEXGRAPH_BENCH_CONTRACTS")
if MODE in ("off", "timed"):
    import time

    from flexgraph.core.executor import Executor

    check = Executor.check_contracts
    spent = [0.0]

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return check(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - start
            print("contracts-seconds", repr(spent[0]), flush=True)

    Executor.check_contracts = (lambda *args, **kwargs: None) if MODE == "off" else timed
