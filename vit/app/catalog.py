"""The checkpoints a user can explore: shipped ``.pt`` files, completed training runs, the supported
models of the local Hugging Face cache, and any model opened by path (``vit.sources.open``).

Entries are described from the checkpoint's stored config and metadata (no model is built),
and a file that cannot be read becomes an entry carrying its error message, so one bad
file never hides the others. Sample images for ``checkpoints/X.pt`` live in
``checkpoints/samples/X/``.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from vit import registry
from vit.checkpoint import (
    CheckpointError,
    ForeignCheckpointError,
    Preprocessing,
    check_payload,
    read_checkpoint_payload,
)
from vit.core.runfiles import (
    BEST_CHECKPOINT,
    CONFIG_FILE,
    DEFAULT_CHECKPOINT,
    LAST_CHECKPOINT,
    STATUS_FILE,
    default_checkpoints_dir,
    default_runs_dir,
    epoch_checkpoints,
    images_in,
    read_json,
)
from vit.core.sizes import describe_size
from vit.core.text import escape_markdown, visible

RUN_CHECKPOINTS = (BEST_CHECKPOINT, LAST_CHECKPOINT)  # a run's checkpoint, in order of preference


@dataclass(frozen=True)
class Candidate:
    """A checkpoint file found on disk, before it is read."""

    path: Path
    source: str  # "checkpoint" (shipped), "run" (completed training run), "hf-cache" or "file" (asked for by path)
    name: str  # file stem or run folder name

    @property
    def fingerprint(self) -> tuple:
        """(path, mtime_ns, size): changes when the file is replaced, e.g. by a retrained checkpoint; a folder's
        (a ViT's, a VLM's, SAM 3's) adds its files' (``files.folder_version``), so one edited in place is read
        again by every page's cache the fingerprint keys."""
        try:
            stat = self.path.stat()
        except OSError:
            return str(self.path), 0, -1
        if self.path.is_dir():
            from vit.sources.files import folder_version

            return str(self.path), stat.st_mtime_ns, stat.st_size, folder_version(self.path)
        return str(self.path), stat.st_mtime_ns, stat.st_size


@dataclass(frozen=True)
class CatalogEntry:
    """One line of the checkpoint picker; ``error`` is set (and the rest mostly empty) when it cannot be read."""

    path: Path
    source: str
    name: str
    dataset: str | None = None
    class_names: tuple[str, ...] = ()
    parameters: int | None = None
    val_acc: float | None = None  # a fraction in [0, 1]
    image_size: int | tuple[int, int] | None = None  # as ViTConfig's: (height, width) for a rectangle
    patch_size: int | tuple[int, int] | None = None
    num_channels: int | None = None
    num_layers: int | None = None
    num_heads: int | None = None
    stage_depths: tuple[int, ...] = ()  # a hierarchical model's (Swin, Hiera): layers per stage, as ViTConfig's
    stage_heads: tuple[int, ...] = ()  # and each stage's heads; empty: num_heads in every layer
    epochs: int | None = None
    error: str | None = None
    metadata: dict = field(default_factory=dict, compare=False, hash=False)
    # How images are prepared, where known before the model is opened; what says that a model sizes each image itself
    preprocessing: Preprocessing | None = field(default=None, compare=False, hash=False)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def label(self) -> str:
        """One line: name, dataset, classes, size and validation accuracy (or that it failed); the name, a run
        folder's or a file's, with its control characters made visible (U+202E would turn the rest around)."""
        head = f"run {visible(self.name)}" if self.source == "run" else visible(self.path.name)
        if self.source == "hf-cache" or self.path.is_dir():
            head = visible(self.name)
        if self.error is not None:
            return f"{head} · cannot be loaded"
        if self.metadata.get("architecture"):  # an imported model: its library and architecture
            classes = f"{len(self.class_names)} classes" if self.class_names else "no classifier"
            return " · ".join([head, str(self.metadata["architecture"]), classes])
        parts = [head, visible(self.dataset or "unknown dataset"), f"{len(self.class_names)} classes"]
        if self.parameters is not None:
            parts.append(format_parameters(self.parameters))
        parts.append(f"val {self.val_acc:.1%}" if self.val_acc is not None else "val n/a")
        return " · ".join(parts)

    @property
    def layers_and_heads(self) -> str:
        """'12 layers × 6 heads', or a hierarchical model's stages: '12 layers in 4 stages (2+2+6+2), 3/6/12/24
        heads' (a Swin's heads differ by stage: one count would be its first stage's)."""
        if len(self.stage_depths) < 2:
            return f"{self.num_layers} layers × {self.num_heads} heads"
        heads = self.stage_heads or (self.num_heads,) * len(self.stage_depths)
        each = "/".join(map(str, heads)) if len(set(heads)) > 1 else str(heads[0])
        return (f"{self.num_layers} layers in {len(self.stage_depths)} stages "
                f"({'+'.join(map(str, self.stage_depths))}), {each} heads")

    @property
    def description(self) -> str:
        """A few lines of Markdown for under the picker; the file's own text (class names, dataset, path) is escaped."""
        if self.error is not None:
            return f"This checkpoint cannot be loaded: {escape_markdown(self.error)}"
        (ih, iw), (ph, pw) = ((v, v) if isinstance(v, int) else v for v in (self.image_size, self.patch_size))
        gh, gw = ih // ph, iw // pw
        rule = self.preprocessing.own_size_rule if self.preprocessing is not None else ""
        # Qwen-VL, NaFlex: image_size is only what the config is built at; no image is shown at it
        size = (f", each image at its own size ({rule}), in {ph if ph == pw else f'{pw}×{ph}'}-px patches" if rule
                else f" of {describe_size(iw, ih, (gh, gw), self.patch_size)}")
        lines = [
            f"**Model** {self.layers_and_heads}, {'greyscale' if self.num_channels == 1 else 'colour'} input{size}, "
            f"{format_parameters(self.parameters) if self.parameters is not None else 'unknown size'}",
        ]
        if self.metadata.get("architecture"):
            road = road_note(self.metadata)
            if road:
                lines.append(f"**Road** {road}")
            left_out = self.metadata.get("left_out") or {}  # attention it runs that no grid places, named
            if left_out:
                why = escape_markdown(visible(str(next(iter(left_out.values())))))
                lines.append(f"**Not drawn** {len(left_out)} of its attention layers ({why})")
            shown = ", ".join(self.class_names[:10]) + (", …" if len(self.class_names) > 10 else "")
            lines.append(f"**Imported** {escape_markdown(visible(self.metadata['architecture']))}; "
                         + (f"{len(self.class_names)} classes: {escape_markdown(visible(shown))}" if self.class_names
                            else "no classifier (a vision-language model's tower: maps and the word lens, no "
                                 "prediction)" if self.metadata.get("tower")
                            else "no classifier (a feature model: maps, no prediction)"))
            if self.metadata.get("class_names_note"):  # a from-scratch model's "class 0", …: how to name them
                lines.append(escape_markdown(visible(str(self.metadata["class_names_note"]))))
            if self.metadata.get("tower"):  # a vision-language model's tower: where it ends, what it is shown
                lines.append(escape_markdown(visible(str(self.metadata["tower"]))))
        else:
            lines.append(f"**Data** {escape_markdown(visible(self.dataset or 'unknown'))}; {len(self.class_names)} "
                         f"classes: {escape_markdown(visible(', '.join(self.class_names)))}")
        trained = []
        if self.val_acc is not None:
            trained.append(f"validation accuracy {self.val_acc:.1%}")
        if self.epochs is not None:
            trained.append(f"{self.epochs} epochs")
        if self.metadata.get("date"):
            trained.append(f"saved {escape_markdown(visible(str(self.metadata['date'])[:10]))}")
        if trained:
            lines.append("**Training** " + ", ".join(trained))
        lines.append(escape_markdown(visible(self.path)))
        return "  \n".join(lines)


LIBRARIES = {"hf": "transformers", "timm": "timm", "open_clip": "open_clip"}  # metadata["architecture"]'s prefix


def road_note(metadata: dict) -> str | None:
    """Which road opened a model, said under the picker: for the library road (``metadata["road"]``), that the
    library's own modules run, their attention recorded; None for a port (our own ViT, the weights mapped onto it)."""
    if metadata.get("road") != "library":
        return None
    library = LIBRARIES.get(str(metadata.get("architecture", "")).partition(":")[0], "its library")
    return (f"opened as {library} builds it (the library road): its own modules run, their attention recorded; this "
            "page draws the maps that road draws")


def format_parameters(count: int) -> str:
    """1_234 -> '1.2 k params', 460_906 -> '0.46 M params', 86_000_000 -> '86.0 M params'."""
    if count >= 10_000_000:
        return f"{count / 1e6:.1f} M params"
    if count >= 100_000:
        return f"{count / 1e6:.2f} M params"
    if count >= 1_000:
        return f"{count / 1e3:.1f} k params"
    return f"{count} params"


def dataset_label(spec: object) -> str | None:
    """A training run's ``--dataset`` as a short name: 'folder:data/cifar10' -> 'cifar10'."""
    if not spec:
        return None
    text = str(spec)
    if text.startswith("folder:"):
        text = text[len("folder:"):].rstrip("/\\")
        parts = [p for p in text.replace("\\", "/").split("/") if p]
        if parts and parts[-1] in ("train", "val") and len(parts) > 1:
            parts = parts[:-1]
        return parts[-1] if parts else None
    return text


def find_checkpoints(checkpoints_dir: str | os.PathLike | None = None,
                     runs_dir: str | os.PathLike | None = None) -> list[Candidate]:
    """Every ``*.pt`` in the checkpoints folder (the default first) and every completed ViT run, without reading them
    (an SAE run's last.pt is no model: ``sae_runs`` lists those for the Features section)."""
    checkpoints_dir = Path(checkpoints_dir) if checkpoints_dir is not None else default_checkpoints_dir()
    runs_dir = Path(runs_dir) if runs_dir is not None else default_runs_dir()
    found: list[Candidate] = []
    if checkpoints_dir.is_dir():
        files = sorted((p for p in checkpoints_dir.glob("*.pt") if p.is_file() and not p.name.startswith(".")),
                       key=lambda p: (p.name != DEFAULT_CHECKPOINT, p.name))
        found += [Candidate(p, "checkpoint", p.stem) for p in files]
    if runs_dir.is_dir():
        for run in sorted(p for p in runs_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
            if run_state(run) != "completed" or is_sae_run(run):
                continue
            for name in RUN_CHECKPOINTS:
                if (run / name).is_file():
                    found.append(Candidate(run / name, "run", run.name))
                    break
    return found


def is_sae_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` is a ``python -m vit.sae train`` run (its config.json says ``"kind": "sae"``)."""
    return (read_json(run_dir / CONFIG_FILE) or {}).get("kind") == "sae"


def sae_runs(runs_dir: str | os.PathLike | None = None) -> list[Path]:
    """The folders of every completed SAE run, by name: what the explorer's Features section offers."""
    runs_dir = Path(runs_dir) if runs_dir is not None else default_runs_dir()
    if not runs_dir.is_dir():
        return []
    return [run for run in sorted(p for p in runs_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
            if run_state(run) == "completed" and is_sae_run(run)]


def run_state(run_dir: Path) -> str | None:
    """The ``state`` in a run's status.json, or None when it is missing or unreadable (e.g. mid-write)."""
    return (read_json(run_dir / STATUS_FILE) or {}).get("state")


def describe(candidate: Candidate, library_road: bool = False) -> CatalogEntry:
    """Check a checkpoint as loading it would, without reading its weights (they are memory-mapped) or
    building a model; errors become the entry's ``error``, so such a file is listed as "cannot be loaded".

    Imported models are described from their config.json (folders) or by opening them (weights files); with
    ``library_road`` (the explorer, which draws such a model's maps), a model no port reads as its library builds it
    (``describe_library``).
    """
    try:
        if candidate.path.is_dir() or candidate.path.suffix != ".pt":
            return describe_import(candidate, library_road)
        payload = read_checkpoint_payload(candidate.path, mmap=True)
        config, _, class_names = check_payload(candidate.path, payload)
    except ForeignCheckpointError:
        return describe_import(candidate, library_road)
    except CheckpointError as e:
        return CatalogEntry(candidate.path, candidate.source, candidate.name, error=str(e))
    metadata = dict(payload.get("metadata") or {})
    parameters = metadata.get("parameters")
    if isinstance(parameters, bool) or not isinstance(parameters, int):
        parameters = sum(int(t.numel()) for t in payload["state_dict"].values())
    val_acc = metadata.get("val_acc")
    if isinstance(val_acc, bool) or not isinstance(val_acc, (int, float)):
        val_acc = metadata.get("best_val_acc")
    epochs = metadata.get("epochs")
    return CatalogEntry(
        path=candidate.path, source=candidate.source, name=candidate.name,
        dataset=dataset_label(metadata.get("dataset")),
        class_names=tuple(class_names),
        parameters=parameters,
        val_acc=float(val_acc) if isinstance(val_acc, (int, float)) and not isinstance(val_acc, bool) else None,
        image_size=config.image_size, patch_size=config.patch_size, num_channels=config.num_channels,
        num_layers=config.num_layers, num_heads=config.num_heads, stage_depths=tuple(config.stage_depths),
        stage_heads=tuple(config.stage_heads),
        epochs=epochs if isinstance(epochs, int) and not isinstance(epochs, bool) else None,
        metadata=metadata,
    )


def describe_import(candidate: Candidate, library_road: bool = False) -> CatalogEntry:
    """An HF or timm folder from its config.json alone (no weights read); a weights file by opening it. With
    ``library_road``, one the ports refuse is described as its library builds it (``describe_library``)."""
    from vit.sources import open as sources
    from vit.sources.ports.families import hf  # the import mappings are only needed for imported models

    path = candidate.path
    preprocessing = None  # unless known without reading weights
    try:
        config_json = sources.read_json(path / "config.json") if path.is_dir() and (path / "config.json").is_file() \
            else None
        wrong = whole_model_problem(path, config_json) if config_json else None
        if wrong:
            raise CheckpointError(f"{path} is refused: {wrong}")
        architectures = (config_json or {}).get("architectures")
        if config_json and "auto_map" not in config_json and isinstance(architectures, list) and architectures \
                and architectures[0] in hf.ARCHITECTURES:
            config = hf.config_from_hf(config_json, architectures[0])
            class_names = sources.hf_class_names(config_json, config.num_classes)
            metadata = {"architecture": f"hf:{architectures[0]}"}
            parameters = count_parameters_of(config)
        elif config_json and "auto_map" not in config_json and config_json.get("model_type") in sources.HF_VLMS:
            checkpoint = sources.open_vlm(path, config_json, "meta")  # the tower's shard headers, none of its data
            config, class_names, metadata = checkpoint.config, [], checkpoint.metadata
            preprocessing = checkpoint.preprocessing
            parameters = count_parameters_of(config)
        elif config_json and "auto_map" not in config_json and config_json.get("model_type") in sources.HF_FAMILIES:
            config, architecture = sources.hf_family_config(path, config_json)  # DINOv3, CLIP, Swin, BEiT, …
            # A family's classifier (Swin, Swin V2, BEiT …ForImageClassification) names its classes as open does.
            class_names = sources.hf_class_names(config_json, config.num_classes) if config.num_classes else []
            metadata = {"architecture": f"hf:{architecture}"}
            # its image processor's settings, a small JSON file: Qwen-VL's and NaFlex's size each image themselves
            preprocessing = sources.hf_preprocessing(sources.hf_image_processor(path), config, architecture)
            note = sources.tower_note(config_json, config, preprocessing)
            if note:
                metadata["tower"] = note
            parameters = count_parameters_of(config)
        elif config_json and isinstance(config_json.get("architecture"), str) \
                and (path / "model.safetensors").is_file():  # timm: shapes from the safetensors header only
            try:
                config, class_names = sources.describe_timm_folder(path, config_json)
            except (CheckpointError, ValueError, TypeError):
                if not library_road:
                    raise
                return describe_library(candidate)  # an architecture the ports refuse, as timm builds it
            metadata = {"architecture": f"timm:{config_json['architecture']}"}
            parameters = count_parameters_of(config)
        else:
            try:
                checkpoint = sources.open_source(path)
            except CheckpointError:
                if not library_road:
                    raise
                return describe_library(candidate)  # no port: as transformers, timm or open_clip builds it
            config, class_names, metadata = checkpoint.config, checkpoint.class_names, checkpoint.metadata
            preprocessing = checkpoint.preprocessing
            parameters = sum(p.numel() for p in checkpoint.model.parameters())
    except (CheckpointError, ValueError, TypeError) as e:
        return CatalogEntry(path, candidate.source, candidate.name, error=str(e).splitlines()[0] if str(e) else repr(e))
    return CatalogEntry(path=path, source=candidate.source, name=candidate.name, class_names=tuple(class_names),
                        parameters=parameters, image_size=config.image_size, patch_size=config.patch_size,
                        num_channels=config.num_channels, num_layers=config.num_layers, num_heads=config.num_heads,
                        stage_depths=tuple(config.stage_depths), stage_heads=tuple(config.stage_heads),
                        metadata=dict(metadata), preprocessing=preprocessing)


def whole_model_problem(path: Path, config_json: dict) -> str | None:
    """What the opener of the whole model in ``path`` refuses before it builds anything, in one line: a SAM 3's
    declared sizes and files (``sam3.folder_problem``), a generating VLM's small files (``declared.files_problem``:
    its files' sizes, its processors' declared sizes, image and video; not its language model's, whose shards a
    folder downloaded for its tower lacks); None for any other model. So the picker lists as refused a folder whose
    page would be refused (issue 114: a Qwen2.5-VL whose video processor declared 2 x 10^8 pixels a frame, a SAM 3
    with a 191 MB tokenizer.json)."""
    from vit.sources import sam3
    from vit.sources.vlm import declared
    from vit.sources.vlm.whole_vlm import can_answer

    if config_json.get("model_type") == sam3.MODEL_TYPE:
        return sam3.folder_problem(path, config_json)
    if not isinstance(config_json.get("text_config"), dict):  # no language model, no VLM: nothing imported (the
        return None  # VLM road's imports hung a forked app server's first page in the browser tests)
    return declared.files_problem(path, config_json) if can_answer(path) else None


def describe_library(candidate: Candidate) -> CatalogEntry:
    """A model no port reads, opened on the library road on the meta device (no weight read: the library builds it
    from its config, the layout checked against the tokens it forms), its sizes read from what the road offers
    (``LibraryModel``: ``layout``, ``num_layers``, ``num_heads``); the library road's one-line refusal as its error
    where that road does not take it either, or any error of the library's in one line (the entry is kept by
    ``describe_current``: a folder that fails is not built again at the next visit)."""
    from vit.sources import open as sources

    path = candidate.path
    try:
        checkpoint = sources.open_source(path, map_location="meta", library_road=True)
    except (CheckpointError, ValueError, TypeError) as e:
        return CatalogEntry(path, candidate.source, candidate.name, error=str(e).splitlines()[0] if str(e) else repr(e))
    except Exception as e:  # a library's own error building a folder nobody picked: listed as refused, kept so
        return CatalogEntry(path, candidate.source, candidate.name,
                            error=f"{path}: {type(e).__name__} building it: {(str(e).splitlines() or [''])[0][:200]}")
    model, p = checkpoint.model, checkpoint.preprocessing
    (ih, iw), (ph, pw) = model.layout.image_hw, model.layout.patch_hw
    return CatalogEntry(path=path, source=candidate.source, name=candidate.name,
                        class_names=tuple(checkpoint.class_names), parameters=checkpoint.metadata.get("parameters"),
                        image_size=ih if ih == iw else (ih, iw), patch_size=ph if ph == pw else (ph, pw),
                        num_channels=p.num_channels, num_layers=model.num_layers, num_heads=model.num_heads,
                        metadata=dict(checkpoint.metadata), preprocessing=p)


def count_parameters_of(config) -> int:
    """The parameter count of a model of ``config``, built on the meta device (no memory, no weights read)."""
    import torch

    from vit.checkpoint import MAX_LAYERS
    from vit.model import ViT

    if config.num_layers > MAX_LAYERS:  # building even an empty model costs ~3 ms a layer
        raise ValueError(f"its config declares {config.num_layers:,} layers, more than the {MAX_LAYERS} this "
                         "program builds")
    with torch.device("meta"):
        return sum(p.numel() for p in ViT(config).parameters())


def hf_cache_dirs() -> list[Path]:
    """The one folder ``huggingface_hub`` keeps downloaded models in, by its own precedence: ``$HF_HUB_CACHE``
    (or the older ``$HUGGINGFACE_HUB_CACHE``), else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``,
    else ``~/.cache/huggingface/hub``. Only that one: a model in another folder is not what this user's
    ``from_pretrained`` would load either."""
    env = os.environ
    cache = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if cache:
        return [Path(cache).expanduser()]
    home = env.get("HF_HOME") or str(Path(env.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface")
    return [Path(home).expanduser() / "hub"]


def hf_snapshot(model_dir: Path) -> Path | None:
    """The snapshot ``refs/main`` points to, else the newest one; None when there is none."""
    from vit.sources.files import MAX_REF_BYTES, SourceError, read_bounded

    snapshots = model_dir / "snapshots"
    try:  # bounded, regular files only: a listed folder's refs/main that is a FIFO or 3 GB never stalls the page
        ref = read_bounded(model_dir / "refs" / "main", MAX_REF_BYTES).decode("ascii", "replace").strip()
        if ref and "/" not in ref and (snapshots / ref).is_dir():
            return snapshots / ref
    except (OSError, SourceError):
        pass
    try:
        folders = [p for p in snapshots.iterdir() if p.is_dir()]
    except OSError:
        return None
    return max(folders, key=lambda p: p.stat().st_mtime, default=None)


# Model folders of the HF cache one listing looks into (reads their config.json): a page load costs the same for
# a cache of 50 models and one of 10,000 (every config.json of 10,000 took 51 s a load and 44 s a rerun). The
# others are a name filter (``contains``) or a path away.
MAX_HF_CACHE_EXAMINED = 50


@dataclass(frozen=True)
class HfCacheListing:
    """The supported models among the first ``examined`` of the ``folders`` model folders whose name matched."""

    candidates: tuple[Candidate, ...]
    folders: int  # models--ORG--NAME folders whose hub name matched the filter
    examined: int  # of which the listing looked into, in name order

    @property
    def complete(self) -> bool:
        return self.examined == self.folders


def hf_cache_folders(cache_dirs: list[Path] | None = None) -> list[tuple[str, Path]]:
    """Every ``models--ORG--NAME`` folder of the caches as (hub name 'ORG/NAME', folder), in name order, from the
    folder names alone (nothing inside is read); the first of a name wins. Read again only when a cache folder's
    modification time changes (a model downloaded or deleted)."""
    found: dict[str, Path] = {}
    for cache in cache_dirs if cache_dirs is not None else hf_cache_dirs():
        try:
            version = cache.stat().st_mtime_ns
        except OSError:
            continue
        for name, folder in _model_folders(str(cache), version):
            found.setdefault(name, folder)
    return sorted(found.items())


@functools.lru_cache(maxsize=8)
def _model_folders(cache: str, version: int) -> tuple[tuple[str, Path], ...]:
    try:
        with os.scandir(cache) as it:
            names = sorted(e.name for e in it if e.name.startswith("models--") and e.is_dir())
    except OSError:
        return ()
    return tuple((n[len("models--"):].replace("--", "/"), Path(cache) / n) for n in names)


def hf_cache_listing(cache_dirs: list[Path] | None = None, contains: str = "",
                     limit: int | None = MAX_HF_CACHE_EXAMINED, library_road: bool = False) -> HfCacheListing:
    """The supported ViTs among the first ``limit`` model folders of the local HF cache whose hub name holds
    ``contains`` (any case), by hub name; reads only those folders' config.json (``limit`` None: every one).
    ``library_road``: those the library road opens too (``supported_snapshot``)."""
    wanted = contains.strip().casefold()
    folders = [(name, folder) for name, folder in hf_cache_folders(cache_dirs) if wanted in name.casefold()]
    examined = folders if limit is None else folders[:limit]
    found = [Candidate(snapshot, "hf-cache", name) for name, folder in examined
             if (snapshot := supported_snapshot(folder, library_road)) is not None]
    return HfCacheListing(tuple(found), len(folders), len(examined))


def hf_cache_note(listing: HfCacheListing, filter_field: str | None, open_field: str | None) -> str | None:
    """One line under a picker whose HF-cache part is cut short: how many folders match and how to reach the
    others (the page's name filter, its field for a path where the visitor may use one); None when complete."""
    if listing.complete:
        return None
    ways = ([f'type part of its name in "{filter_field}"'] if filter_field else []) \
        + ([f'give its folder to "{open_field}"'] if open_field else [])
    where = " or ".join(ways) if ways else "ask the server's owner to open it"
    return (f"{listing.folders:,} models in the Hugging Face cache match; the supported ones among the first "
            f"{listing.examined:,} by name are listed. For another one, {where}.")


def find_hf_cache_models(cache_dirs: list[Path] | None = None) -> list[Candidate]:
    """Every supported ViT in the local HF cache (``models--ORG--NAME``), by hub name; reads only config.json.
    A page lists a bounded first part instead (``hf_cache_listing``)."""
    return list(hf_cache_listing(cache_dirs, limit=None).candidates)


def supported_snapshot(model_dir: Path, library_road: bool = False) -> Path | None:
    """The snapshot of an HF cache model folder when it holds a model this program opens, judged by its
    config.json alone (or an open_clip_config.json); None otherwise, e.g. for custom code (``auto_map``). With
    ``library_road`` (the explorer), a transformers vision model no port reads that the library road takes
    (``transformers_models.opens``) and a timm architecture timm knows that the ports refuse are listed too."""
    from vit.sources import open as sources
    from vit.sources.ports.families import hf
    from vit.sources.ports.libraries import import_timm

    snapshot = hf_snapshot(model_dir)
    if snapshot is None:
        return None
    if not (snapshot / "config.json").is_file():
        return snapshot if (snapshot / sources.OPEN_CLIP_CONFIG).is_file() else None  # an open_clip model
    try:
        config_json = sources.read_json(snapshot / "config.json")
    except CheckpointError:
        return None
    if "auto_map" in config_json:
        return None  # custom code: never run, so never listed
    architectures = config_json.get("architectures")
    timm_name = config_json.get("architecture")
    if isinstance(architectures, list) and architectures and architectures[0] in hf.ARCHITECTURES:
        return snapshot
    if config_json.get("model_type") in sources.HF_FAMILIES:  # DINOv3, CLIP, SigLIP, AIMv2
        return snapshot
    if config_json.get("model_type") in sources.HF_VLMS:  # LLaVA, PaliGemma, Gemma 3, InternVL: their towers
        return snapshot
    if registry.plugin_family(config_json.get("model_type")) is not None:  # a plugin's family (vit.registry)
        return snapshot
    if isinstance(timm_name, str):
        try:
            if sources.timm_family(timm_name) is import_timm:  # EVA-02, DINOv3, AIMv2, PE have modules of their own
                import_timm.check_name(timm_name)
        except ValueError:
            return snapshot if library_road and _timm_knows(timm_name) else None
        return snapshot
    if library_road and config_json.get("model_type") not in registry.hf_model_types():
        from vit.sources.library_road import transformers_models

        return snapshot if transformers_models.opens(config_json) else None
    return None


def _timm_knows(name: str) -> bool:
    """Whether timm builds an architecture of this name (``NAME`` or ``NAME.TAG``)."""
    import timm

    return timm.is_model(name)


def model_candidates(contains: str = "") -> list[Candidate]:
    """The models a page lists without a path: shipped checkpoints, completed runs, then the supported models
    among the first ``MAX_HF_CACHE_EXAMINED`` folders of the local HF cache whose name holds ``contains`` (a
    cache of thousands of models would otherwise cost every page load seconds)."""
    return find_checkpoints() + list(hf_cache_listing(contains=contains).candidates)


@functools.lru_cache(maxsize=256)
def _describe_version(candidate: Candidate, fingerprint: tuple[str, int, int], library_road: bool = False
                      ) -> CatalogEntry:
    return describe(candidate, library_road)


def describe_current(candidate: Candidate, library_road: bool = False) -> CatalogEntry:
    """``describe(candidate, library_road)``, read once per version of the file (its fingerprint: path, mtime,
    size), so a page that lists the checkpoints on every rerun does not read every file each time."""
    return _describe_version(candidate, candidate.fingerprint, library_road)


def list_checkpoints(checkpoints_dir: str | os.PathLike | None = None,
                     runs_dir: str | os.PathLike | None = None) -> list[CatalogEntry]:
    """Every shipped checkpoint and completed run, described; unreadable ones carry their error."""
    return [describe_current(c) for c in find_checkpoints(checkpoints_dir, runs_dir)]


def default_entry(entries: list[CatalogEntry]) -> CatalogEntry | None:
    """The shipped default checkpoint if it loads, else the first entry that does, else None."""
    for entry in entries:
        if entry.ok and entry.source == "checkpoint" and entry.path.name == DEFAULT_CHECKPOINT:
            return entry
    return next((e for e in entries if e.ok), None)


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two paths name the same file (relative or absolute, through links)."""
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


def candidate_for(path: str | os.PathLike, candidates: list[Candidate]) -> Candidate:
    """The listed candidate for ``path`` (e.g. a run's best.pt handed over by the training page), else a new one.

    A path that is not listed (a run's last.pt, a file elsewhere) still gets a candidate, so the
    explorer can open any checkpoint it is pointed at; a run folder's file is named after the run.
    """
    for candidate in candidates:
        if same_file(candidate.path, path):
            return candidate
    path = Path(path)
    if path.parent.joinpath(STATUS_FILE).is_file():
        return Candidate(path, "run", path.parent.name)
    return Candidate(path, "file", path.stem)


def sample_images(entry: CatalogEntry, entries: list[CatalogEntry],
                  checkpoints_dir: str | os.PathLike | None = None) -> list[Path]:
    """The sample images for a checkpoint: ``samples/<stem>/`` next to it, else those of a shipped
    checkpoint with the same class names (so a run on CIFAR-10 gets the CIFAR-10 samples)."""
    checkpoints_dir = Path(checkpoints_dir) if checkpoints_dir is not None else default_checkpoints_dir()
    own = images_in(entry.path.parent / "samples" / entry.path.stem)
    if own or not entry.ok:
        return own
    for other in entries:
        if other.ok and other.source == "checkpoint" and other.class_names == entry.class_names:
            images = images_in(checkpoints_dir / "samples" / other.path.stem)
            if images:
                return images
    return []


def epoch_candidates(runs_dir: str | os.PathLike | None = None) -> list[Candidate]:
    """Every run's per-epoch checkpoints (``--save-every``), finished or not, oldest epoch first per run."""
    runs_dir = Path(runs_dir) if runs_dir is not None else default_runs_dir()
    found = []
    if runs_dir.is_dir():
        for run in sorted(p for p in runs_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
            found += [Candidate(path, "run", f"{run.name} epoch {epoch}")
                      for epoch, path in epoch_checkpoints(run).items()]
    return found


def run_folder(path: str | os.PathLike) -> Path | None:
    """The run folder a run's checkpoint belongs to (``best.pt``, ``last.pt`` or a per-epoch one), else None."""
    path = Path(path)
    for folder in (path.parent, path.parent.parent):
        if (folder / CONFIG_FILE).is_file() or (folder / STATUS_FILE).is_file():
            return folder
    return None



def hub_candidate(text: str) -> Candidate | None:
    """The HF-cache snapshot of the Hub model ``text`` names (``ORG/NAME[@REV]``, ``hf-hub:``, a timm or open_clip
    name) as a candidate named after its repository, when the cache holds it (no network); None when it does not.
    ``hub.HubError`` when ``text`` names no Hub model."""
    from vit.sources import hub

    name = hub.parse_name(text)
    if name is None:
        raise hub.HubError(f"{text.strip()!r} is not a Hub id: give ORG/NAME[@REVISION], hf-hub:ORG/NAME or a timm "
                           "model name")
    snapshot = hub.cached_snapshot(name)
    return Candidate(snapshot, "hf-cache", str(name)) if snapshot is not None else None


def open_from_hub(text: str, may_download: bool, library_road: bool = False):
    """What a page's "Open from the Hub" field does with ``text``: ``(candidate, None)`` when the HF cache holds a
    copy that opens (``library_road``: on the library road too, as the explorer opens it), else
    ``(None, download)``, the files and size to show before a download button. ``HubError`` (one line) for a name
    that is no Hub model, one the Hub refuses, one too large to download here, and for a visitor who may not
    download."""
    from vit.sources import hub

    found = hub_candidate(text)
    if found is not None and describe_current(found, library_road).ok:
        return found, None
    if found is not None and not may_download:  # in the cache, refused: why, not a download this visitor may not make
        raise hub.HubError(describe_current(found, library_road).error or f"{text.strip()} cannot be opened")
    if not may_download:
        raise hub.HubError("This model is not in the server's Hugging Face cache, and downloading it takes the "
                           "training token: enter it on the Train page.")
    wanted = _planned(hub.parse_name(text), int(time.monotonic() // PLAN_SECONDS))
    if found is not None and not wanted.files:  # all there, and it does not open: say why
        raise hub.HubError(describe_current(found, library_road).error or f"{text.strip()} cannot be opened")
    hub.check_size(wanted)  # over the bound or the disk: said now, not after a click on its Download button
    return None, wanted


PLAN_SECONDS = 300  # a page reruns on every click: the Hub's file list is read again after this long at most


@functools.lru_cache(maxsize=16)
def _planned(name, period: int):
    """The files still to fetch for ``name``: of a sharded vision-language model, the shards its tower is in (its
    config.json and shard index fetched first, kilobytes: ``hub.only_needed_shards``, as ``vit.predict``
    downloads), never its language model's gigabytes, which "Ask the VLM" offers when asked (``missing_from_hub``)."""
    from vit.sources import hub
    from vit.sources.open import needed_shards

    return hub.only_needed_shards(_whole_planned(name, period), needed=needed_shards)


def missing_from_hub(name, files: frozenset[str], may_download: bool):
    """``files`` of the Hub model ``name`` at its commit (``hub.snapshot_of`` a snapshot of the HF cache), which the
    snapshot lacks (of a sharded VLM's language model, which "Open from the Hub" left on the Hub), with their sizes:
    what a page offers to download. ``HubError`` (one line) for a visitor who may not download and a download over
    the bound or the disk."""
    from vit.sources import hub

    if not may_download:
        raise hub.HubError(f"The server's Hugging Face cache holds {name.repo_id} without its language model, and "
                           "downloading it takes the training token: enter it on the Train page.")
    wanted = _whole_planned(name, int(time.monotonic() // PLAN_SECONDS))
    wanted = hub.Download(wanted.name, wanted.commit, tuple((f, n) for f, n in wanted.files if f in files))
    hub.check_size(wanted)
    return wanted


@functools.lru_cache(maxsize=16)
def _whole_planned(name, period: int):
    """Every file of ``name`` the cache lacks (``hub.plan``), the Hub's file list asked once a ``period``."""
    from vit.sources import hub

    return hub.plan(name)


def forget_hub_plans() -> None:
    """Read the Hub's file lists again at the next ``open_from_hub``: a download just brought files a list kept
    from before it still gives as missing."""
    _planned.cache_clear()
    _whole_planned.cache_clear()
