"""Process setup details that are not about strategies."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from flexgraph.training.runtime import return_freed_memory

pytestmark = pytest.mark.slow

SCRIPT = """
import ctypes, sys
import torch
sys.path.insert(0, {repo!r})
from flexgraph.training.runtime import make_env, return_freed_memory
libc = ctypes.CDLL("libc.so.6")
class Info(ctypes.Structure):  # struct mallinfo2
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = Info
{setup}
for _ in range(3):  # a sharded step: gather a 16 MiB block, use it, free it
    block = torch.ones(4 << 20)
    del block
print(libc.mallinfo2().arena)
"""


def _heap_after_frees(setup: str) -> int:
    """glibc's heap (``mallinfo2().arena``) in a fresh process after ``setup`` and three
    16 MiB blocks freed."""
    repo = str(Path(__file__).resolve().parents[3])
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(repo=repo, setup=setup)],
                          capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_only_a_run_of_several_processes_gives_freed_blocks_back_to_the_os():
    """A fixed threshold (4 MiB) for several processes, glibc's adaptive one for one process
    (see ``make_env``); ``env_cfg.malloc_mmap_threshold`` overrides either."""
    single = _heap_after_frees("make_env({}, device='cpu', world_size=1)")
    several = _heap_after_frees("make_env({}, device='cpu', world_size=2)")
    # glibc's adaptive threshold keeps the freed 16 MiB in the heap; a fixed one does not
    assert single - several >= 15 << 20, "one process keeps glibc's adaptive threshold"
    configured = _heap_after_frees(
        "make_env({'env_cfg': {'malloc_mmap_threshold': 4 << 20}}, device='cpu', world_size=1)")
    assert single - configured >= 15 << 20, "env_cfg.malloc_mmap_threshold still applies"
    assert return_freed_memory(0) is False, "0 keeps glibc's own behaviour"
