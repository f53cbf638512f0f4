"""What a new training run is launched with: the form's parameters, their validation and the command.

``RunParams`` is what the training page's form asks for; ``validate_params`` reports every
problem the training CLI would, per field, using the CLI's own parser and messages; and
``launch_command`` is the ``python -m vit.train`` (or torchrun) command line that starts it.
``SAEParams``, ``validate_sae_params`` and ``sae_command`` do the same for a sparse autoencoder's run
(``python -m vit.sae train``).
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path

from vit.core.runfiles import LAUNCH_DIR, ROOT
from vit.runs.devices import count_gpus

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")  # whole names only (fullmatch): ASCII, no controls

# Bounds of what the page may launch (the CLI itself is not bounded): the page may face a network.
MAX_EPOCHS = 1000
MAX_BATCH_SIZE = 4096
MAX_PARAMETERS = 350_000_000  # ViT-L/16 (304 M) still fits
MAX_PATCHES = 4096  # a 64 x 64 patch grid; attention memory grows with its square
DATA_ROOTS_ENV = "VIT_DATA_ROOTS"  # folders (os.pathsep-separated) that folder: datasets may come from
_SYSTEM_FOLDERS = (Path("/proc"), Path("/sys"), Path("/dev"))

# Figures the seed reproduces with a preset; shown next to it in the form.
PRESET_FIGURES = {
    "tintn-cifar10": "75.5 % CIFAR-10 (seed blog)",
    "cifar10-p8": "~69 % CIFAR-10 (seed notebook)",
    "mnist-p7": "98.5 % MNIST (seed)",
}


def default_data_dir() -> Path:
    """Where built-in datasets and decoded caches live: $VIT_DATA_DIR when set, else the repository's data/."""
    env = os.environ.get("VIT_DATA_DIR")
    if env:
        return Path(env).expanduser()
    return ROOT / "data"


class ValidationError(ValueError):
    """Launch parameters that the CLI would refuse; ``errors`` maps each bad field to its message."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = errors


# ---------------------------------------------------------------------------------------------
# Launch parameters


@dataclass
class RunParams:
    """What the form asks for. ``None`` leaves a field to the preset or the --recipe."""

    name: str
    dataset: str  # cifar10, cifar100, mnist, fashion-mnist or folder:PATH (relative to the repository)
    preset: str | None = "tintn-cifar10"  # not passed when the run starts from init
    init: str | None = None  # start from this model (file or folder, relative to the repository) instead
    finetune: str | None = None  # with init: "full" or "linear-probe" (None: the CLI's, full)
    layer_decay: float | None = None  # with init and full fine-tuning: layer-wise lr decay (None: the CLI's, off)
    image_size: int | None = None
    patch_size: int | None = None
    hidden_size: int | None = None
    num_layers: int | None = None
    num_heads: int | None = None
    mlp_size: int | None = None
    recipe: str = "ours"
    epochs: int | None = None
    time_budget: str | None = None  # a duration as vit.train reads it (600, 10m, 1.5h): as many epochs as fit
    batch_size: int | None = None
    lr: float | None = None
    weight_decay: float | None = None
    warmup_epochs: float | None = None
    label_smoothing: float | None = None
    augment: str | None = None
    aug_magnitude: int | None = None
    ema: float | None = None
    drop_path: float | None = None  # stochastic depth of the last block (the preset's when None)
    mixup: float | None = None  # mixup's alpha (0: off)
    cutmix: float | None = None  # cutmix's alpha (0: off)
    mix_prob: float | None = None  # the share of batches mixed, with mixup or cutmix
    random_erasing: float | None = None  # the probability an image loses a box
    precision: str | None = None  # auto, fp32 or bf16 (None: the CLI's auto)
    compile: bool = False  # torch.compile (a flag)
    seed: int = 0
    devices: tuple[str, ...] = ("cpu",)  # ("cpu",), ("cuda:N",), several GPUs for torchrun, or ("ray",)
    threads: int | None = None  # CPU threads per training process; None: the CLI's (torch's) choice
    save_every: int | None = None  # keep every Nth epoch's weights to compare in the explorer (None: off)
    attention_every: int | None = None  # attention snapshots every N epochs (None: the CLI's default, 1)
    workers: int | None = None  # ("ray",) only: Ray Train workers (one CPU each)
    gpus_per_worker: float | None = None  # ("ray",) only: GPUs per worker (0: train on the workers' CPUs)


# RunParams fields passed to the CLI as --field-name VALUE: all but the name, the dataset (resolved
# first) and the devices (which choose between a process and torchrun).
CLI_FIELDS = tuple(f.name for f in fields(RunParams)
                   if f.name not in ("name", "dataset", "devices", "workers", "gpus_per_worker"))
RAY = ("ray",)  # the devices of a run on the Ray cluster at $VIT_RAY_ADDRESS
RAY_ADDRESS_ENV = "VIT_RAY_ADDRESS"  # set by whoever starts the server: a visitor never gives an address
MAX_RAY_WORKERS = 64
MAX_GPUS_PER_WORKER = 8
MODEL_SIZE_FIELDS = ("image_size", "patch_size", "hidden_size", "num_layers", "num_heads", "mlp_size")
CROSS_FIELDS = (*MODEL_SIZE_FIELDS, "warmup_epochs", "finetune", "layer_decay")  # validity depends on others


def default_data_roots(data_dir: Path | None = None) -> tuple[Path, ...]:
    """Where the page's folder: datasets may come from: $VIT_DATA_ROOTS, else the data folder and the
    repository's data/. The filesystem root and system folders (/proc, /sys, /dev) are never roots."""
    env = os.environ.get(DATA_ROOTS_ENV)
    candidates = [Path(p).expanduser() for p in env.split(os.pathsep) if p.strip()] if env else \
        [data_dir if data_dir is not None else default_data_dir(), ROOT / "data"]
    roots: list[Path] = []
    for candidate in candidates:
        root = Path(os.path.realpath(candidate))
        if root == Path(root.anchor) or any(root == s or s in root.parents for s in _SYSTEM_FOLDERS):
            continue
        if root not in roots:
            roots.append(root)
    return tuple(roots)


def folder_problem(spec: str, roots: tuple[Path, ...]) -> str | None:
    """Why a ``folder:`` dataset may not be used from the page, or None; links are resolved first, and the
    message is the same whether or not a path outside the roots exists."""
    path = Path(os.path.realpath(resolve_dataset(spec)[len("folder:"):]))
    if any(path == root or root in path.parents for root in roots):
        return None
    allowed = ", ".join(str(r) for r in roots) or "no folder"
    return (f"folder datasets must be inside {allowed}; put the images there (or set {DATA_ROOTS_ENV} when "
            "starting the app)")


def hide_data_roots(message: str, roots: tuple[Path, ...]) -> str:
    """``message`` with each data root's absolute path replaced by the root's folder name, for a visitor from the
    network: '/srv/me/data/cats does not exist' -> 'data/cats does not exist'. Where the server keeps its data
    is the server log's to say, not the page's. A longer root is replaced first (one may lie inside another),
    and only whole path components ('/srv/me/database' is not the root '/srv/me/data')."""
    for root in sorted({Path(os.path.realpath(r)) for r in roots} | set(map(Path, roots)),
                       key=lambda r: len(str(r)), reverse=True):
        if root == Path(root.anchor):
            continue
        name = root.name or str(root)
        after = r"(?=[/\\\s'\",;:)\]]|\.(?:\s|$)|$)"
        message = re.sub(re.escape(str(root)) + after, lambda _, name=name: name, message)
    return message


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def resolve_dataset(spec: str) -> str:
    """``folder:`` paths made absolute (relative ones are relative to the repository)."""
    spec = spec.strip()
    if spec.startswith("folder:") and len(spec) > len("folder:"):
        path = Path(spec[len("folder:"):]).expanduser()
        if not path.is_absolute():
            path = ROOT / path
        return f"folder:{path}"
    return spec


def resolve_path(path: str) -> str:
    """A path from the form made absolute, relative to the repository as the training process sees it."""
    resolved = Path(path.strip()).expanduser()
    return str(resolved if resolved.is_absolute() else ROOT / resolved)


def cli_values(params: RunParams) -> list[tuple[str, object]]:
    """(field, value) of every ``CLI_FIELDS`` entry the command line gets: those set, the preset only without
    --init (the model is then the imported one), the --init path made absolute."""
    values = []
    for name in CLI_FIELDS:
        value = getattr(params, name)
        if value is None or value is False or (name == "preset" and params.init):
            continue
        values.append((name, resolve_path(value) if name == "init" else value))
    if params.time_budget is not None and params.epochs is None:  # the page's bound, not the CLI's 10,000
        values.append(("epochs", MAX_EPOCHS))
    return values


def _cli_pair(name: str, value: object) -> list[str]:
    """A field's command-line arguments: ``--flag VALUE``, or the flag alone for a switch (True)."""
    return [_flag(name)] if value is True else [_flag(name), str(value)]


def cli_args(params: RunParams, out: Path, data_dir: Path) -> list[str]:
    """The ``vit.train`` arguments of a new run (device arguments excluded)."""
    argv = ["--dataset", resolve_dataset(params.dataset), "--out", str(out), "--data-dir", str(data_dir)]
    for name, value in cli_values(params):
        argv += _cli_pair(name, value)
    return argv


def ray_address() -> str | None:
    """The Ray cluster the Train page may launch on: $VIT_RAY_ADDRESS (a job-submission address such as
    http://127.0.0.1:8265), or None when the server was started without one."""
    address = os.environ.get(RAY_ADDRESS_ENV, "").strip()
    return address or None


def ray_arguments(workers: int | None, gpus_per_worker: float | None) -> list[str]:
    """``vit.train``'s Ray flags for the page's cluster; RunError-free: the address was checked at validation."""
    return ["--ray", ray_address() or "", "--workers", str(workers or 1),
            "--gpus-per-worker", f"{gpus_per_worker or 0:g}", "--device", "cuda" if gpus_per_worker else "cpu"]


def device_argument(devices: tuple[str, ...]) -> str:
    """The CLI's --device: cpu, cuda:N, or cuda when torchrun gives each rank its GPU."""
    return devices[0] if len(devices) == 1 else "cuda"


def launch_command(argv: list[str], devices: tuple[str, ...], nice: int = 0, workers: int | None = None,
                   gpus_per_worker: float | None = None) -> tuple[list[str], dict[str, str]]:
    """(command, extra environment) starting ``vit.train argv``: torchrun for several GPUs; for ``RAY`` the
    command that submits the run to the cluster and follows it (SIGTERM stops the job gracefully)."""
    prefix = ["nice", "-n", str(nice)] if nice > 0 and shutil.which("nice") else []
    if devices == RAY:
        return [*prefix, sys.executable, "-m", "vit.train", *argv, *ray_arguments(workers, gpus_per_worker)], {}
    argv = [*argv, "--device", device_argument(devices)]
    if len(devices) == 1:
        return [*prefix, sys.executable, "-m", "vit.train", *argv], {}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    indices = [int(d.split(":")[1]) for d in devices]
    if visible:  # our indices count the GPUs this process sees; map them back to the machine's
        physical = [v.strip() for v in visible.split(",")]
        ids = [physical[i] for i in indices]
    else:
        ids = [str(i) for i in indices]
    command = [*prefix, sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={len(devices)}", "-m", "vit.train", *argv]
    return command, {"CUDA_VISIBLE_DEVICES": ",".join(ids)}


def _usage_message(text: str) -> tuple[str | None, str]:
    """(field, message) for one of the CLI's UsageError texts; field None when none is named."""
    match = re.match(r"argument (--[a-z-]+): (.*)", text)
    if match:
        return _field_of_flag(match.group(1)), match.group(2)
    match = re.search(r"ViTConfig\.([a-z_]+)", text)
    if match:
        return match.group(1), text
    match = re.search(r"--[a-z-]+", text)
    if match:
        return _field_of_flag(match.group(0)), text
    return None, text


def _field_of_flag(flag: str) -> str | None:
    name = flag[2:].replace("-", "_")
    return {"out": "name", "device": "devices"}.get(name, name)


def validate_params(params: RunParams, runs_dir: Path, data_dir: Path,
                    gpu_count: int | None = None, data_roots: tuple[Path, ...] | None = None) -> dict[str, str]:
    """Every problem the CLI would report for ``params``, as {field: message}; empty when fine.

    Each field is checked alone through ``vit.training.options.parse_args`` (the CLI's own rules and
    messages), then all together for rules that span fields (warmup below epochs, patch size
    dividing image size, ...), plus what only we know: the run name, the devices, the page's
    bounds (epochs, batch size, model size) and that folder datasets lie inside ``data_roots``
    (default ``default_data_roots(data_dir)``).
    """
    from vit.training.data import DataError, check_dataset
    from vit.training.options import model_config, parse_args, resolve_model
    from vit.training.trainer import UsageError

    errors: dict[str, str] = {}
    problem = name_problem((params.name or "").strip(), runs_dir)
    if problem:
        errors["name"] = problem

    dataset = resolve_dataset(params.dataset or "")
    classes = None
    if not dataset:
        errors["dataset"] = "choose a dataset"
    elif dataset.startswith("folder:") and folder_problem(dataset, data_roots or default_data_roots(data_dir)):
        errors["dataset"] = folder_problem(dataset, data_roots or default_data_roots(data_dir))
    else:
        try:
            classes = check_dataset(dataset, data_dir)
        except DataError as e:
            errors["dataset"] = str(e)

    if params.init is not None and not params.init.strip():
        errors["init"] = "choose a model to start from, or give its path"

    device_error = _device_problem(tuple(params.devices), gpu_count)
    if device_error:
        errors["devices"] = device_error
    errors.update(_ray_problems(params))

    out = str(runs_dir / LAUNCH_DIR / ".validate-nonexistent")  # parse_args only checks it is empty
    base = ["--dataset", "cifar10", "--out", out, "--device", "cpu"]
    for name_, value in cli_values(params):
        try:
            parse_args([*base, *_cli_pair(name_, value)])
        except UsageError as e:
            if name_ in CROSS_FIELDS and not str(e).startswith("argument "):
                continue  # e.g. patch size vs image size: judged below with all fields together
            errors[name_] = _usage_message(str(e))[1]
    if errors:
        return errors
    try:
        argv = cli_args(params, Path(out), data_dir)
        args = parse_args([*argv, "--device", "cpu"])
    except UsageError as e:
        field_, message = _usage_message(str(e))
        if field_ is None and "preset" in str(e):
            field_ = "preset"
        errors[field_ if field_ in {f.name for f in fields(RunParams)} else "form"] = message
        return errors
    num_classes = len(classes) if classes else 100 if dataset == "cifar100" else 10
    if args.init:  # the imported model opens as the training process will open it (its weights are read)
        try:
            config = resolve_model(args, num_classes, classes)
        except UsageError as e:
            return {"init": str(e)}
    else:
        config = model_config(args, num_channels=3, num_classes=num_classes)
    return _bounds_problems(args, config)


def _bounds_problems(args, config) -> dict[str, str]:
    """The page's bounds on a run the CLI accepts (its model's ``config``): epochs, batch size, patches per
    image and parameters."""
    import torch

    from vit.checkpoint import MAX_LAYERS
    from vit.model import ViT, count_parameters

    errors: dict[str, str] = {}
    if args.epochs > MAX_EPOCHS:
        errors["epochs"] = f"at most {MAX_EPOCHS} epochs from this page"
    if args.batch_size > MAX_BATCH_SIZE:
        errors["batch_size"] = f"at most {MAX_BATCH_SIZE} images per batch from this page"
    if config.num_patches > MAX_PATCHES:
        errors["image_size"] = (f"{config.image_size} px in {config.patch_size}-px patches is {config.num_patches:,} "
                                f"patches per image; at most {MAX_PATCHES:,} from this page")
    if config.num_layers > MAX_LAYERS:
        errors["num_layers"] = f"at most {MAX_LAYERS} layers"
    else:
        try:
            with torch.device("meta"):  # counts without allocating, whatever the sizes
                parameters = count_parameters(ViT(config))
        except (RuntimeError, ValueError, TypeError, OverflowError):  # sizes past what torch can count
            parameters = None
        if parameters is None or parameters > MAX_PARAMETERS:
            size = "more parameters than can be counted" if parameters is None else \
                f"{parameters / 1e6:,.0f} M parameters"
            errors["form"] = f"this model has {size}; at most {MAX_PARAMETERS / 1e6:,.0f} M from this page"
    return errors


def _ray_problems(params: RunParams) -> dict[str, str]:
    """The Ray fields: set for a Ray run only, and within the page's bounds."""
    errors: dict[str, str] = {}
    if tuple(params.devices) != RAY:
        if params.workers is not None or params.gpus_per_worker is not None:
            errors["workers"] = "workers and GPUs per worker are for runs on a Ray cluster"
        return errors
    workers, gpus = params.workers if params.workers is not None else 1, params.gpus_per_worker or 0
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MAX_RAY_WORKERS:
        errors["workers"] = f"from 1 to {MAX_RAY_WORKERS} workers"
    if isinstance(gpus, bool) or not isinstance(gpus, (int, float)) or not 0 <= gpus <= MAX_GPUS_PER_WORKER:
        errors["gpus_per_worker"] = f"from 0 to {MAX_GPUS_PER_WORKER} GPUs per worker"
    return errors


def _device_problem(devices: tuple[str, ...], gpu_count: int | None) -> str | None:
    if not devices:
        return "choose a device"
    if devices == RAY:
        return None if ray_address() else (f"no Ray cluster: start the app with {RAY_ADDRESS_ENV} set to the "
                                           "cluster's address (e.g. http://127.0.0.1:8265)")
    if "ray" in devices:
        return "a run goes to the Ray cluster or to this machine's devices, not both"
    if len(set(devices)) != len(devices):
        return "a device is listed twice"
    if devices == ("cpu",):
        return None
    if "cpu" in devices:
        return "train on the CPU or on GPUs, not both"
    if gpu_count is None:
        gpu_count = count_gpus()
    for device in devices:
        match = re.fullmatch(r"cuda:(\d+)", device)
        if not match:
            return f"{device!r} is not a device; use cpu or cuda:N"
        if int(match.group(1)) >= gpu_count:
            if gpu_count == 0:
                return "this machine has no CUDA GPU; train on the CPU"
            return f"{device} does not exist; this machine has {gpu_count} GPU(s), cuda:0 to cuda:{gpu_count - 1}"
    return None


def default_threads(cores: int | None = None, load: float | None = None) -> int:
    """CPU threads for a new run on this machine: 1 on two cores or fewer, else the cores the 1-minute load
    average leaves idle minus one (for the app and whatever else runs), between 1 and 8.

    On a shared two-core machine 2 threads fell to 8-13 images/s where 1 thread kept 170-195: threads
    that wait for a busy core stall every step, so only idle cores are counted.
    """
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if load is None:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if cores <= 2:
        return 1
    return max(1, min(8, cores - 1 - round(load)))


def preset_summary(name: str) -> str:
    """'tintn-cifar10 · 0.12 M parameters · reproduces 75.5 % CIFAR-10 (seed blog)'."""
    parts = [name, f"{preset_parameters(name) / 1e6:.2f} M parameters"]
    if name in PRESET_FIGURES:
        parts.append(f"reproduces {PRESET_FIGURES[name]}")
    return " · ".join(parts)


def preset_parameters(name: str) -> int:
    """Parameter count of a preset as defined (its own classes and channels), built on the meta device."""
    import torch

    from vit.model import PRESETS, ViT, count_parameters

    with torch.device("meta"):  # no memory, even for vit-huge-14
        return count_parameters(ViT(PRESETS[name]))


def suggest_name(dataset: str, preset: str, now: float | None = None) -> str:
    """A fresh run name such as 'cifar10-tintn-cifar10-20261120-2251'."""
    short = dataset.rstrip("/").split("/")[-1].removeprefix("folder:") or "run"
    stamp = dt.datetime.fromtimestamp(now if now is not None else time.time()).strftime("%Y%m%d-%H%M%S")
    return re.sub(r"[^A-Za-z0-9._-]", "-", f"{short}-{preset}-{stamp}")


def dataset_spec(choice: str, folder: str) -> str:
    """The --dataset value of the form's dataset choice: a built-in name, or folder:PATH."""
    return f"folder:{folder.strip()}" if choice == "folder" else choice



# ---------------------------------------------------------------------------------------------
# Sparse autoencoder runs (``python -m vit.sae train``)


@dataclass
class SAEParams:
    """What the page's SAE form asks for: a TopK SAE on one layer's residual stream of ``model``."""

    name: str
    model: str  # a file or folder the project opens (relative to the repository)
    data: str  # a folder of images (any depth), inside the data roots
    layer: int  # the residual stream after this block, counted from 1
    k: int = 16
    expansion: int | None = 8  # latents = expansion x the model's width; None when ``width`` is given
    width: int | None = None
    epochs: int = 5
    images: int | None = None  # training images (None: the CLI's 2,000)
    seed: int = 0
    devices: tuple[str, ...] = ("cpu",)  # ("cpu",), ("cuda:N",) or ("ray",)
    workers: int | None = None  # ("ray",) only: Ray Train workers
    kind: str = "sae"  # tells a launch record's parameters from a ViT run's


MAX_SAE_WIDTH = 2**20  # vit.features.autoencoder.MAX_D_SAE; the CLI checks memory before anything runs


def sae_cli_args(params: SAEParams, out: Path) -> list[str]:
    """``vit.sae train``'s arguments for a new run (device arguments excluded)."""
    argv = ["train", resolve_path(params.model), "--data", resolve_path(params.data), "--layer", str(params.layer),
            "--k", str(params.k), "--epochs", str(params.epochs), "--seed", str(params.seed), "--out", str(out)]
    argv += ["--width", str(params.width)] if params.width else ["--expansion", str(params.expansion or 8)]
    if params.images:
        argv += ["--images", str(params.images)]
    return argv


def sae_command(argv: list[str], devices: tuple[str, ...], nice: int = 0, workers: int | None = None
                ) -> tuple[list[str], dict[str, str]]:
    """(command, extra environment) of ``python -m vit.sae argv`` on ``devices``: one GPU is made the only one
    visible; ``RAY`` harvests and trains on the page's cluster."""
    prefix = ["nice", "-n", str(nice)] if nice > 0 and shutil.which("nice") else []
    command = [*prefix, sys.executable, "-m", "vit.sae", *argv]
    if devices == RAY:
        return [*command, "--ray", ray_address() or "", "--workers", str(workers or 1)], {}
    if devices == ("cpu",):
        return [*command, "--device", "cpu"], {}
    index = int(devices[0].split(":")[1])
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpu = [v.strip() for v in visible.split(",")][index] if visible else str(index)
    return [*command, "--device", "cuda"], {"CUDA_VISIBLE_DEVICES": gpu}


def name_problem(name: str, runs_dir: Path) -> str | None:
    """Why ``name`` cannot name a new run in ``runs_dir``, or None."""
    if not name:
        return "give the run a name"
    if not NAME_PATTERN.fullmatch(name):
        return "use letters, digits, '.', '_' and '-' only, starting with a letter or digit (at most 100)"
    if (runs_dir / name).exists() or (runs_dir / LAUNCH_DIR / name).exists():
        return f"a run named {name!r} already exists; choose another name"
    return None


def validate_sae_params(params: SAEParams, runs_dir: Path, data_roots: tuple[Path, ...],
                        gpu_count: int | None = None) -> dict[str, str]:
    """Every problem of ``params`` the page can see before a process starts, as {field: message}; what only the
    model tells (a layer past its blocks, a width memory cannot hold) the CLI reports in one line, and the run
    fails with it."""
    errors: dict[str, str] = {}
    problem = name_problem((params.name or "").strip(), runs_dir)
    if problem:
        errors["name"] = problem
    if not (params.model or "").strip():
        errors["model"] = "choose the model whose layer the SAE reads"
    elif not Path(resolve_path(params.model)).exists():
        errors["model"] = f"{params.model.strip()} does not exist"
    data = (params.data or "").strip()
    if not data:
        errors["data"] = "give a folder of images"
    else:
        spec = resolve_dataset(f"folder:{data}")
        problem = folder_problem(spec, data_roots)
        if problem is None and not Path(spec[len("folder:"):]).is_dir():
            problem = f"{data} is not a folder"
        if problem:
            errors["data"] = problem
    for field_, value, low, high in (("layer", params.layer, 1, 1000), ("k", params.k, 1, MAX_SAE_WIDTH),
                                     ("epochs", params.epochs, 1, MAX_EPOCHS),
                                     ("expansion", params.expansion, 1, 256),
                                     ("width", params.width, 1, MAX_SAE_WIDTH),
                                     ("images", params.images, 1, 10_000_000)):
        if value is None and field_ in ("expansion", "width", "images"):
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            errors[field_] = f"a whole number from {low:,} to {high:,}"
    if params.width and params.k and isinstance(params.k, int) and params.k > params.width:
        errors["k"] = f"k must not exceed the width ({params.width:,})"
    device = _device_problem(tuple(params.devices), gpu_count)
    if device is None and len(params.devices) > 1:
        device = "an SAE trains on one device (or on the Ray cluster)"
    if device:
        errors["devices"] = device
    if tuple(params.devices) != RAY and params.workers is not None:
        errors["workers"] = "workers are for runs on a Ray cluster"
    elif tuple(params.devices) == RAY and not 1 <= (params.workers or 1) <= MAX_RAY_WORKERS:
        errors["workers"] = f"from 1 to {MAX_RAY_WORKERS} workers"
    return errors
