"""Which device a training process uses, and the process group of a run under ``torchrun``.

``torchrun --nproc_per_node=N -m vit.train ...`` starts N processes with RANK, LOCAL_RANK and
WORLD_SIZE set: NCCL joins them on GPUs (each takes the GPU of its local rank), gloo on CPUs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch
import torch.distributed as dist

from vit.core.cli import UsageError
from vit.training.specs import check_device


def parse_device(spec: str, here: bool = True) -> torch.device:
    """The device of ``--device``: auto (CUDA when available), cpu, cuda or cuda:N; UsageError otherwise.
    ``here`` False: the run is for other machines (a Ray cluster's workers), so only the spelling is checked, not
    whether this machine has that device."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    check_device(spec)  # the spelling, and cpu or cuda (vit.training.specs: the same lines without torch)
    device = torch.device(spec)
    if device.type == "cuda" and here:
        if not torch.cuda.is_available():
            raise UsageError(f"--device {spec}: CUDA is not available on this machine; use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UsageError(f"--device {spec}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def init_distributed(device_spec: str) -> tuple[int, int]:
    """(rank, world size): joins torchrun's process group when WORLD_SIZE > 1, else (0, 1).

    A group that already exists (Ray Train sets one up before it calls the training function)
    is used as it is."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1
    if rank_device(device_spec).type == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    else:
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def rank_device(device_spec: str) -> torch.device:
    """Under torchrun: the GPU of this process's local rank, unless the run is on the CPU."""
    if parse_device(device_spec).type == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if local_rank >= torch.cuda.device_count():
            raise UsageError(f"local rank {local_rank} has no GPU: this machine has {torch.cuda.device_count()}; "
                             "start fewer processes per node")
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


@contextlib.contextmanager
def main_rank_first(rank: int, world: int) -> Iterator[None]:
    """Run the block on rank 0 first, then on the other ranks (e.g. rank 0 decodes and caches a
    dataset that the others then read from the cache instead of all decoding at once)."""
    if world > 1 and rank != 0:
        dist.barrier()
    yield
    if world > 1 and rank == 0:
        dist.barrier()


def close_distributed() -> None:
    """Leave the process group, if this process joined one."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
