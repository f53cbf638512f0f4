"""A Ray run's graceful stop, from its driver to its workers (``vit.runs.ray_train``, ``vit.runs.ray_sae``).

The job's SIGTERM (``ray job stop``, the command's Ctrl-C, the Train page's Stop) reaches the driver only. The driver
sets the run's ``StopFlag``; every worker polls it (``watch``) and stops as on its own SIGTERM: it finishes the step,
writes last.pt and ends ``cancelled``.

The flag is a key in the cluster's own key-value store (the GCS's, which every Ray process is connected to), not an
actor: an actor is one more worker process per job, whose start (importing Ray) cost ~2 s of CPU on the test
cluster's two cores, for a value set at most once. The key is random per run, so two runs never share a flag, and the
driver deletes it when the run ends.
"""

from __future__ import annotations

import threading
import uuid
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vit.training.session import StopRequest

NAMESPACE = "vit-stop"  # the key-value store's namespace of the runs' stop flags
POLL_SECONDS = 0.5  # how often a worker looks at the flag


def _kv():
    # Ray's own wrappers of the GCS key-value store (Ray Tune and Serve keep their state there too); imported when
    # used: the process is connected to the cluster by then.
    from ray.experimental import internal_kv

    return internal_kv


class StopFlag:
    """Set once by the driver on SIGTERM/SIGINT (the first signal wins); read by every worker. Pickled into the
    workers' config: it holds only its key."""

    def __init__(self, key: str | None = None) -> None:
        self.key = key or f"run-{uuid.uuid4().hex}"

    def request(self, signum: int) -> None:
        _kv()._internal_kv_put(self.key, str(int(signum)), overwrite=False, namespace=NAMESPACE)

    def requested(self) -> int | None:
        value = _kv()._internal_kv_get(self.key, namespace=NAMESPACE)
        return int(value) if value else None

    def clear(self) -> None:
        """Remove the key: the run has ended (a driver killed first leaves a few bytes in the GCS)."""
        _kv()._internal_kv_del(self.key, namespace=NAMESPACE)


def watch(flag: StopFlag, stop: StopRequest, done: threading.Event, poll: float = POLL_SECONDS) -> None:
    """A worker's watcher thread: every ``poll`` seconds until ``done``, turn a requested stop into ``stop``'s
    signal, as the signal handler records it (without its KeyboardInterrupt)."""
    while not done.wait(poll):
        try:
            signum = flag.requested()
        except Exception:  # noqa: BLE001 - the cluster may be going away; the job then ends anyway
            continue
        if signum:
            stop.signum = signum
            return
