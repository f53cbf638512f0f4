"""What the memory tests measure, written once: a fresh process's resident-set peak over its resident set just
before a piece of work, and the slack that peak has on any machine (tests/test_costs.py, test_checkpointed_states.py,
test_layout_memory.py; their workers import it from the tests folder).

The peak is VmHWM, reset through /proc/self/clear_refs, not getrusage's ru_maxrss (that also keeps the peak of any
thread that has exited since, which clear_refs does not reset). glibc is told to hand every freed block of 64 KB or
more back at once, so a view's tensors are counted where they are allocated, not hidden in what earlier work freed.
"""

from __future__ import annotations

import ctypes
import gc
import os
import re
import resource
import subprocess
from pathlib import Path

from vit.core.forkserver import ForkServer

ROOT = Path(__file__).resolve().parents[1]

# What a resident set's peak moves by beyond the tensors it holds, from one fresh process (or CPU dispatch, or
# allocator) to the next. Measured by bench/bench_memory_noise.py (bench/results/cpu-2026-11-25/memory-noise.txt):
# 57 cells of 6 families, each in 4 fresh processes under two CPU capabilities, spread at most 0.62 MB; the earlier
# harness, one process for all of a family's views, 1.8 MB. Four MB leaves room for machines it did not run on
# (pages, arenas, a BLAS's buffers). Added once to an estimate before it is compared with a measured peak; a
# compared estimate is sized to be several times it (tests/test_costs.py's DOMINATES).
ALLOCATOR_SLACK = 4 * 2**20


def environment(**extra: str) -> dict[str, str]:
    """A measuring subprocess's environment: one thread, glibc returning freed blocks at once, the repository
    importable."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "VIT_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536",
            "MALLOC_TRIM_THRESHOLD_": "65536", "PYTHONPATH": str(ROOT), **extra}


def can_reset_the_peak() -> bool:
    """Whether this kernel lets a process reset its VmHWM (not in every container)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def resident() -> int:
    """The bytes resident now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def start() -> int:
    """Collect, trim the heap, reset the peak to now; the resident bytes it starts from."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return resident()


def peak() -> int:
    """The resident set's high-water mark since the last reset, in bytes."""
    with open("/proc/self/status") as f:
        return int(re.search(r"VmHWM:\s+(\d+) kB", f.read()).group(1)) * 1024


# --- one measuring process per test process: imports once, a fork per piece of work -------------------------------

# The server (vit.core.forkserver): the measuring environment's interpreter with torch, transformers and vit imported
# once (about 8 s of CPU a fresh interpreter spent per cell, 38 cells and more), then a fork per request, so each piece
# of work still starts from the same clean process (its own heap, its own peak reset by clear_refs), not from what an
# earlier one left. One thread and glibc's thresholds (``environment()``) are read once, at the server's start. The
# server freezes what its preload made (``gc.freeze``): ``start``'s collection walks the child's own objects only, not
# the preload's 378,621 (0.2 s of CPU each, three or more a cell, and half a MB of pages copied; issue 112).
PRELOAD = f"""import sys
sys.path.insert(0, {str(ROOT / "tests")!r})
import numpy, torch, transformers, PIL.Image  # what every worker imports first, once
import vit.checkpoint, vit.costs.plan, vit.explain.views.method_maps, vit.explain.views.image_analysis
import vit.explain.views.attention_maps, vit.explain.methods.stage_maps, vit.core.inference
"""
# What the library road's and the VLMs' asks import at their first use (transformers' UDOP, I-JEPA, SAM 3, GLM-4.1V
# and Qwen2.5-VL classes and processors): 3-3.5 s of CPU in a fresh process, which each of test_declared_build's nine
# and test_vlm_clip_work's three measured asks paid again (issue 112). Imported once by a second server (``ROADS``),
# which only those modules start; each ask still opens its model before its measure starts, as before.
ROADS = """import vit.app.catalog, vit.sources.open, vit.explain.language.vlm_answer, vit.sources.vlm.whole_vlm
for name in ("UdopForConditionalGeneration", "IJepaModel", "Sam3Model", "Glm4vForConditionalGeneration",
             "Glm4vProcessor", "Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLProcessor", "Qwen2VLVideoProcessor",
             "Qwen2VLImageProcessor", "AutoProcessor", "AutoModel"):
    getattr(transformers, name)
"""
# What a gradient through checkpointed blocks imports at its first use: ``torch.utils.checkpoint``'s non-reentrant
# path imports ``torch._dynamo`` (and sympy with it), 1.2 s of CPU in each fork that first ran the class map's or
# AttnLRP's path in chunks (tests/test_costs.py's warm-up: six of its cells; its two AttnLRP tests took 9.1 and 9.4 s
# of CPU, 5.6 and 4.9 with it preloaded: bench/results/cpu-2026-11-29f/memory-costs-*.txt, issue 112). Imported once
# by the memory group's server (``MEMORY_GROUP``: the three memory modules pass it, so they still share one); each
# cell still warms its own view before it is measured, as before.
GRADIENTS = "import torch._dynamo\n"
# The memory group's server's preload (test_costs, test_layout_memory, test_checkpointed_states pass it): the
# gradients' imports and pytest, which each of their workers imported again through the module it reads its model from
# (``from test_costs import build``: 0.1 s of CPU a fork, 44 forks; issue 112)
MEMORY_GROUP = GRADIENTS + "import pytest\n"
_servers: dict[str, ForkServer] = {}


def run_measured(code: str, argv: list[str], timeout: float, preload: str = "",
                 **env: str) -> subprocess.CompletedProcess:
    """``code`` run as ``python -c code *argv`` would run it in a fresh measuring process (``environment(**env)``),
    but forked from this process's measuring server (one per ``preload``: what it imports beyond ``PRELOAD``, e.g.
    ``ROADS``): its exit code, stdout and stderr. ``subprocess.TimeoutExpired`` past ``timeout`` seconds (the work
    is killed)."""
    return _server(preload).run(code, argv, env=env, timeout=timeout)


def run_forked(code: str, argv: list[str], timeout: float, **env: str) -> subprocess.CompletedProcess:
    """``code`` run as ``python -c code *argv`` would run it, in a process of its own forked from this process's
    measuring server (``run_measured`` without a preload of its own): for a check that needs a process (one it kills
    or that kills itself mid-write, one that may block past a timeout, a peak of its own) but not a fresh
    interpreter's imports. ``python -c`` paid ~2 s of CPU importing torch for each (issue 112)."""
    return run_measured(code, argv, timeout, **env)


def _server(preload: str) -> ForkServer:
    """This process's measuring server for ``preload``; for none (``""``), any one already running: each imported
    ``PRELOAD`` first, and a second would import torch and transformers again (2.7 s of CPU) for what the first
    holds (a view's peak is its growth over what the process held before it: more shared pages move neither)."""
    if not preload and preload not in _servers and _servers:
        return next(iter(_servers.values()))
    if preload not in _servers:
        _servers[preload] = ForkServer(PRELOAD + preload, env=environment(), cwd=str(ROOT))
    return _servers[preload]
