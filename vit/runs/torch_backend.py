"""Ray Train's torch process-group setup (``ray.train.torch.TorchConfig``) without torch in Train's controller.

Ray Train's controller, an actor of its own for every run, holds the trainer's backend config and calls its backend's
``on_start`` and ``on_shutdown``, which only hand functions to the workers. Ray's ``TorchConfig`` lives in a module that
imports torch at its top, so the controller imported torch to unpickle it, and held it for the whole run on the head
node: 4.6 -> 2.5 s of CPU per controller without it (bench/results/cpu-2026-11-30b/ray-train-before-after.txt). This
config is Ray's, field for field, and its backend makes the same calls to the workers in the same order (Ray's own
functions of ``ray.train.torch.config``, imported there, where torch is loaded anyway), from a module that imports no
torch.

Not covered, as a job of ours never asks for them: TPUs (``tpu_dist``) and Ray Train's v1 worker group.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import ray
from ray.train.backend import Backend, BackendConfig

logger = logging.getLogger(__name__)


def on_the_worker(name: str, *args: Any, **kwargs: Any) -> Any:
    """Ray's ``ray.train.torch.config.NAME(*args, **kwargs)``, run on a Train worker."""
    from ray.train.torch import config

    return getattr(config, name)(*args, **kwargs)


def set_master(addr: str, port: int) -> None:
    """What Ray's ``init_method="env"`` sets on each worker before the process group starts."""
    import os

    os.environ["MASTER_ADDR"] = addr
    os.environ["MASTER_PORT"] = str(port)


class _DeviceContext:
    """Ray's ``TorchConfigContextManager`` (each worker's CUDA device around the training function), loaded on the
    worker that enters it."""

    def __enter__(self):
        from ray.train.torch.config import TorchConfigContextManager

        self._inner = TorchConfigContextManager()
        return self._inner.__enter__()

    def __exit__(self, *exc) -> bool:
        return self._inner.__exit__(*exc)


@dataclass
class LeanTorchConfig(BackendConfig):
    """Ray's ``TorchConfig``: the process group's backend (gloo, nccl; None: nccl on GPUs, else gloo), how it starts
    (``env`` or ``tcp``) and its timeout."""

    backend: str | None = None
    init_method: str = "env"
    timeout_s: int = 1800

    @property
    def backend_cls(self):
        return LeanTorchBackend

    @property
    def train_func_context(self):
        return _DeviceContext

    @property
    def framework(self):
        from ray.train.v2._internal.util import TrainingFramework

        return TrainingFramework.TORCH

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "init_method": self.init_method, "timeout_s": self.timeout_s}


class LeanTorchBackend(Backend):
    """Ray's ``_TorchBackend`` for a v2 worker group on CPUs or GPUs, its torch calls made on the workers."""

    share_cuda_visible_devices: bool = True

    def on_start(self, worker_group, backend_config: LeanTorchConfig) -> None:
        from ray._common.network_utils import build_address
        from ray.train._internal.utils import get_address_and_port

        backend = backend_config.backend
        if backend is None:
            backend = "nccl" if worker_group.get_resources_per_worker().get("GPU", 0) > 0 else "gloo"
        if backend == "tpu_dist":
            raise ValueError("LeanTorchConfig does not set up TPUs; use Ray's TorchConfig")
        addr, port = worker_group.execute_single(0, get_address_and_port)
        if backend_config.init_method == "env":
            worker_group.execute(set_master, addr, port)
            url = "env://"
        elif backend_config.init_method == "tcp":
            url = f"tcp://{build_address(addr, port)}"
        else:
            raise ValueError(f"The provided init_method ({backend_config.init_method}) is not supported. Must be "
                             "either 'env' or 'tcp'.")
        worker_group.execute(on_the_worker, "_set_torch_distributed_env_vars")
        ray.get([worker_group.execute_single_async(i, on_the_worker, "_setup_torch_process_group", backend=backend,
                                                   world_rank=i, world_size=len(worker_group), init_method=url,
                                                   timeout_s=backend_config.timeout_s)
                 for i in range(len(worker_group))])

    def on_shutdown(self, worker_group, backend_config: LeanTorchConfig) -> None:
        from ray._private import ray_constants
        from ray.exceptions import GetTimeoutError
        from ray.train.constants import (
            DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
            TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
        )

        futures = worker_group.execute_async(on_the_worker, "_shutdown_torch",
                                             destroy_process_group=len(worker_group) > 1)
        timeout_s = ray_constants.env_integer(TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
                                              DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S)
        try:
            ray.get(futures, timeout=timeout_s)
        except GetTimeoutError:
            logger.warning(f"Torch process group shutdown timed out after {timeout_s} seconds")
