"""Ray Train's ``TorchTrainer`` as a job of ours runs it (``vit.runs.ray_train``, ``vit.runs.ray_sae``): without
the actors it never uses, and without torch in the job's driver and Train's controller (``LeanTorchConfig``). A
module of its own: importing it loads Ray Train (Ray Data, pandas, pyarrow), which a job's driver does only once the
run's arguments and data have passed its checks."""

from __future__ import annotations

from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

from vit.runs.torch_backend import LeanTorchConfig

# Two actors Ray Train starts for every run that a job of ours never uses, each one more process importing Ray (part of
# the Ray modules' 373 -> 324 s of CPU, bench/results/cpu-2026-11-29f/ray-*.txt): the Ray Data DatasetManager, started
# whether or not the trainer was given datasets (our workers read their data themselves; vit.sae's harvest runs its own
# Ray Data pipeline), and the detached PlacementGroupCleaner, which removes the workers' placement group should the
# controller die while its driver lives on. Our driver lives only as long as ``fit``: a dead controller ends ``fit``,
# the driver exits with the job, and Ray removes the placement groups of a job that has ended.
UNUSED_CALLBACKS = ("DatasetsCallback", "PlacementGroupCleanerCallback")


class LeanTorchTrainer(DataParallelTrainer):
    """Ray Train's ``TorchTrainer`` without the callbacks (and their actors) of ``UNUSED_CALLBACKS``; the
    datasets' callback stays when it is given datasets. Its process group is set up by ``LeanTorchConfig``
    (vit.runs.torch_backend), Ray's ``TorchConfig`` from a module that imports no torch. Ray's ``TorchTrainer`` is
    this base class given a ``TorchConfig`` (gloo on CPUs, nccl on GPUs), and its module imports torch: the job's
    driver, which never trains, loaded it for that alone (test_ray_train's drivers 14.2 -> 5.5 s of CPU without it,
    bench/results/cpu-2026-11-30b/ray-train-jobs-no-torch-before-after.txt)."""

    def __init__(self, train_loop_per_worker, *, torch_config: LeanTorchConfig | None = None, **kwargs) -> None:
        config = torch_config or LeanTorchConfig()
        if not config.backend:  # as Ray's TorchTrainer chooses it
            scaling = kwargs.get("scaling_config")
            config.backend = "nccl" if scaling is not None and scaling.use_gpu else "gloo"
        super().__init__(train_loop_per_worker, backend_config=config, **kwargs)

    def _create_default_callbacks(self) -> list:
        unused = set(UNUSED_CALLBACKS) - ({"DatasetsCallback"} if self.datasets else set())
        return [callback for callback in super()._create_default_callbacks()
                if type(callback).__name__ not in unused]
