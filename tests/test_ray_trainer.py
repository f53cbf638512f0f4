"""What a Ray run's driver does before and instead of Ray Train's defaults (``vit.runs.ray_train``), without a
cluster: the actors of Ray Train's that a job of ours never uses are not started, and a dataset the workers would
refuse is refused in the driver, before any worker starts. That real jobs still train, stop and resume with them is
the cluster tests' (test_ray_train.py, test_sae_ray.py)."""

from __future__ import annotations

import pytest
from helpers import TINY_TRAIN, make_image_folder

# vit.runs.ray_train imports Ray Train (and torch): in the tests, not at collection, which every lane pays for.


def callbacks(trainer_class, **kwargs) -> list[str]:
    from ray.train import RunConfig, ScalingConfig

    trainer = trainer_class(lambda config: None, scaling_config=ScalingConfig(num_workers=2),
                            run_config=RunConfig(name="lean"), **kwargs)
    return [type(callback).__name__ for callback in trainer._create_default_callbacks()]  # no cluster needed


# Ray's own: its DataContext's deprecated options, copied by every TorchTrainer (the datasets' callback)
@pytest.mark.filterwarnings("ignore:.*(deprecated|instead).*:DeprecationWarning:ray.data.context")
def test_the_jobs_trainer_leaves_out_the_actors_a_run_of_ours_never_uses_and_nothing_else():
    from ray.train.torch import TorchTrainer

    from vit.runs.lean_trainer import UNUSED_CALLBACKS, LeanTorchTrainer

    ray_s = callbacks(TorchTrainer)
    # Ray's own trainer still has both (a Ray that renamed them would leave ours starting their actors again).
    assert set(UNUSED_CALLBACKS) <= set(ray_s), ray_s
    assert callbacks(LeanTorchTrainer) == [name for name in ray_s if name not in UNUSED_CALLBACKS]
    # Given datasets, their callback (the DatasetManager that shards them) stays.
    assert callbacks(LeanTorchTrainer, datasets={"train": lambda: None}) == [
        name for name in ray_s if name != "PlacementGroupCleanerCallback"]


TINY = [*TINY_TRAIN, "--device", "cpu"]  # the tiny model test_distributed trains


def test_a_dataset_the_workers_would_refuse_is_refused_in_the_driver_in_one_line(tmp_path, capsys):
    from vit.runs.ray_train import check_before_the_workers

    (tmp_path / "empty" / "train").mkdir(parents=True)
    refused = check_before_the_workers(["--dataset", f"folder:{tmp_path / 'empty'}", "--out", str(tmp_path / "run"),
                                        *TINY])
    assert refused == 2
    err = capsys.readouterr().err
    assert err == (f"vit.train: error: {tmp_path / 'empty' / 'train'} needs at least two class subfolders with "
                   f"images (found 0); lay it out as {tmp_path / 'empty' / 'train'}/<class>/<image>\n")
    # a good folder, a resume (its dataset is the run's) and a built-in dataset go on to the workers
    images = make_image_folder(tmp_path / "images", per_class=1)
    assert check_before_the_workers(["--dataset", f"folder:{images}", "--out", str(tmp_path / "run"), *TINY]) is None
    assert check_before_the_workers(["--resume", str(tmp_path / "run")]) is None
    assert check_before_the_workers(["--dataset", "cifar10", "--out", str(tmp_path / "run"), *TINY]) is None
    assert capsys.readouterr().err == ""
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv", [["--dataset", "folder:"], ["--dataset", "imagenet-x"]])
def test_arguments_the_workers_would_refuse_are_refused_in_the_driver(argv, tmp_path, capsys):
    from vit.runs.ray_train import check_before_the_workers

    assert check_before_the_workers([*argv, "--out", str(tmp_path / "run"), *TINY]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vit.train: error:") and err.count("\n") == 1, err


def test_a_driver_refusing_its_run_loads_no_ray(tmp_path, monkeypatch, capsys):
    # A job refused in its driver ends before Ray and Ray Train (Ray Data, pandas, pyarrow: ~1.3 s of CPU) load: with
    # them unimportable, the driver module still imports and refuses the run (it would fail to import were they
    # imported at its top again).
    import importlib
    import sys

    for name in ("ray", "ray.train", "ray.train.torch", "vit.runs.lean_trainer"):
        monkeypatch.setitem(sys.modules, name, None)  # `import name` raises ImportError
    monkeypatch.delitem(sys.modules, "vit.runs.ray_train", raising=False)
    ray_train = importlib.import_module("vit.runs.ray_train")
    (tmp_path / "empty" / "train").mkdir(parents=True)
    argv = ["--workers", "1", "--name", "run", "--", "--dataset", f"folder:{tmp_path / 'empty'}", "--out",
            str(tmp_path / "run"), *TINY]
    assert ray_train.main(argv) == 2
    assert capsys.readouterr().err.startswith("vit.train: error:")


def test_the_jobs_torch_config_is_rays_and_its_driver_and_controller_load_no_torch(tmp_path):
    # Train's controller unpickles the trainer's backend config; Ray's TorchConfig made it import torch (~2 s of CPU
    # and the memory it holds for the run), and the job's driver imported it for Ray's TorchTrainer and its dataset
    # check. In a process where torch cannot be imported, the driver's check passes a good folder, its trainer is
    # built and its config unpickles; the config's fields, defaults and backend's flags are Ray's. That the workers
    # still form the process group and train is the cluster tests' (test_ray_train.py: two Ray workers equal two
    # torchrun processes).
    import dataclasses
    import subprocess
    import sys

    import ray.cloudpickle as cloudpickle
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig

    from vit.runs.lean_trainer import LeanTorchTrainer
    from vit.runs.torch_backend import LeanTorchConfig

    def fields(config_class) -> list[tuple]:
        return [(f.name, f.default) for f in dataclasses.fields(config_class)]

    assert fields(LeanTorchConfig) == fields(TorchConfig)
    assert LeanTorchConfig().to_dict() == TorchConfig().to_dict()
    assert LeanTorchConfig().framework == TorchConfig().framework
    for flag in ("share_cuda_visible_devices", "has_replica_groups"):
        assert getattr(LeanTorchConfig().backend_cls, flag) == getattr(TorchConfig().backend_cls, flag), flag
    trainer = LeanTorchTrainer(lambda config: None, scaling_config=ScalingConfig(num_workers=2),
                               run_config=RunConfig(name="lean"))
    assert trainer.backend_config == LeanTorchConfig(backend="gloo")  # as Ray's TorchTrainer sets it on CPUs
    images = make_image_folder(tmp_path / "images", per_class=1)
    driver = ("import pickle, sys; sys.modules['torch'] = None\n"  # `import torch` raises ImportError
              "config = pickle.loads(sys.stdin.buffer.read()); print(config.backend, config.backend_cls.__name__)\n"
              "from vit.runs.ray_train import check_before_the_workers\n"
              f"print(check_before_the_workers(['--dataset', 'folder:{images}', '--out', '{tmp_path / 'run'}']))\n"
              "from ray.train import RunConfig, ScalingConfig\n"
              "from vit.runs.lean_trainer import LeanTorchTrainer\n"
              "trainer = LeanTorchTrainer(print, scaling_config=ScalingConfig(num_workers=2, use_gpu=True),\n"
              "                           run_config=RunConfig(name='lean'))\n"
              "print(trainer.backend_config.backend)\n")
    done = subprocess.run([sys.executable, "-c", driver], input=cloudpickle.dumps(trainer.backend_config),
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().split() == ["gloo", "LeanTorchBackend", "None", "nccl"]  # nccl on GPUs, as Ray's
