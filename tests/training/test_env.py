"""Process setup details that are not about strategies."""

from __future__ import annotations

import subprocess
import sys

import pytest

from flexgraph.training.runtime import return_freed_memory

SCRIPT = """
import ctypes, sys
import torch
sys.path.insert(0, {repo!r})
from flexgraph.training.runtime import return_freed_memory
libc = ctypes.CDLL("libc.so.6")
class Info(ctypes.Structure):  # struct mallinfo2
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = Info
if {fixed}:
    assert return_freed_memory(4 << 20)
for _ in range(3):  # a sharded step: gather a 16 MiB block, use it, free it
    block = torch.ones(4 << 20)
    del block
print(libc.mallinfo2().arena)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_blocks_above_the_threshold_go_back_to_the_os():
    from pathlib import Path

    repo = str(Path(__file__).resolve().parents[2])

    def heap_after_frees(fixed: bool) -> int:
        done = subprocess.run([sys.executable, "-c", SCRIPT.format(repo=repo, fixed=fixed)],
                              capture_output=True, text=True, check=True)
        return int(done.stdout.split()[-1])

    # glibc's adaptive threshold keeps the freed 16 MiB in the heap; a fixed one does not
    assert heap_after_frees(False) - heap_after_frees(True) >= 15 << 20
    assert return_freed_memory(0) is False, "0 keeps glibc's own behaviour"
