"""The devices a run can train on (each CUDA GPU, all of them under torchrun, the CPU) as the
training page lists them."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceInfo:
    key: str  # "cpu" or "cuda:N"
    name: str
    total_bytes: int | None = None  # GPUs only
    free_bytes: int | None = None

    @property
    def label(self) -> str:
        if self.total_bytes is None:
            return f"CPU ({self.name})"
        used = (self.total_bytes - (self.free_bytes or 0)) / 2**30
        return f"GPU {self.key.split(':')[1]} · {self.name} · {used:.1f} of {self.total_bytes / 2**30:.0f} GiB in use"


def count_gpus() -> int:
    """How many CUDA GPUs this process sees (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def list_devices() -> list[DeviceInfo]:
    """Every CUDA GPU with its name and memory (total, free right now), then the CPU."""
    import torch

    found = []
    for i in range(count_gpus()):
        props = torch.cuda.get_device_properties(i)
        free, total = torch.cuda.mem_get_info(i)
        found.append(DeviceInfo(f"cuda:{i}", props.name, total, free))
    import platform

    found.append(DeviceInfo("cpu", f"{os.cpu_count()} cores, {platform.machine()}"))
    return found


def device_choices(devices: list[DeviceInfo], users: dict[str, list[str]] | None = None
                   ) -> list[tuple[tuple[str, ...], str]]:
    """The form's device options as (devices, label): each GPU, all GPUs under torchrun, the CPU.

    ``users`` ({device: running run names}, see ``RunManager.device_users``) adds who uses each.
    """
    users = users or {}

    def label(device: DeviceInfo, text: str) -> str:
        names = users.get(device.key)
        return f"{text} · used by {', '.join(names)}" if names else text

    gpus = [d for d in devices if d.key != "cpu"]
    choices = [((d.key,), label(d, d.label)) for d in gpus]
    if len(gpus) > 1:
        choices.append((tuple(d.key for d in gpus), f"All {len(gpus)} GPUs (torchrun, one process per GPU)"))
    cpu = next((d for d in devices if d.key == "cpu"), DeviceInfo("cpu", "CPU"))
    choices.append((("cpu",), label(cpu, cpu.label if gpus else f"{cpu.label}: no CUDA GPU on this machine")))
    return choices


def devices_overlap(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Whether two device requests share a device; 'cuda:*' (a run of unknown GPUs) meets every GPU."""
    return any(x == y or ("cuda:*" in (x, y) and x.startswith("cuda") and y.startswith("cuda")) for x in a for y in b)


def device_label(devices: tuple[str, ...]) -> str:
    if devices == ("cpu",):
        return "CPU"
    if devices == ("ray",):
        return "the Ray cluster"
    if len(devices) == 1:
        return devices[0].replace("cuda:", "GPU ")
    return f"{len(devices)} GPUs (" + ", ".join(d.split(":")[1] for d in devices) + ")"

