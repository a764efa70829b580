"""For benchmarks/contracts.py only: ``FLEXGRAPH_BENCH_CONTRACTS=off`` runs no contract.

On the benchmark's ``PYTHONPATH`` in both modes, so both start alike; off, the
executor's contract check does nothing in every process of the run.
"""

import os

if os.environ.get("FLEXGRAPH_BENCH_CONTRACTS") == "off":
    from flexgraph.core.executor import Executor

    Executor.check_contracts = lambda *args, **kwargs: None
