"""The library road for PE video (transformers' ``PeVideoEncoder``, model_type ``pe_video_encoder``, or the video
encoder of its ``PeVideoModel``, model_type ``pe_video``, beside a text model), a clip in.

transformers builds it as two models in one: each frame goes through a timm PE-Core ViT (``TimmWrapper`` around
timm's ``Eva``, pooled to one vector a frame by its attention-pooling head), then a temporal transformer runs over
``[CLS, one token per frame]`` (RMSNorm, RoPE, attention through transformers' attention interface). Both run as the
libraries build them; their attention is recorded where each library lets it be:

- the temporal layers' through the recording attention over SDPA (``vit.core.recording_attention``), the asked
  layers' probabilities computed by the modelling file's own eager function, as for any transformers model of the
  library road (``transformers_models``);
- each frame's spatial attention in the trunk through timm's explicit path for the asked layers, the probabilities
  its ``attn_drop`` receives (``timm_models``), over every frame of the clip at once (the trunk runs on the clip's
  frames as one batch).

Where the tokens sit: the temporal layers' token 0 is the CLS and token ``1 + f`` frame ``f`` (the whole frame; a
convolution over time of width 3, ``PeVideoResnetBlock1d``, mixes its neighbours into it before the first layer); the
trunk's are a frame's ``num_prefix_tokens`` (PE-Core's CLS) then its patch grid row-major (``LibraryLayout``, read
off the trunk's patch embedding, as timm's library road reads it). ``ClipAttention.placed`` lays either on the
frames' grids, ``(frames, rows, cols)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from vit.checkpoint import Checkpoint, Preprocessing
from vit.core import recording_attention
from vit.sources.files import SourceError, _one_line, library_error_line, library_errors
from vit.sources.hf_preprocessing import hf_preprocessing
from vit.sources.library_road import timm_models
from vit.sources.library_road.class_reading import read_class
from vit.sources.library_road.transformers_models import (
    ROAD,
    LibraryLayout,
    LibraryModel,
    _AttentionRecorder,
    declared_problem,
    traced_key_counts,
)

# config.json model_types opened here (``transformers_models.OWN_LAYOUTS``) -> transformers' class that reads it
MODEL_TYPES = {"pe_video_encoder": "PeVideoEncoder", "pe_video": "PeVideoModel"}
VIDEO_PROCESSOR = "video_preprocessor_config.json"  # PeVideoVideoProcessor's save_pretrained
MAX_FRAMES = 1024  # the clip lengths a video processor may ask for
DEFAULT_FRAMES = 16  # frames sampled where the video processor names none (it then takes every frame of a clip)
TEMPORAL_PREFIX = 1  # the temporal layers' CLS before the frames' tokens


@dataclass(frozen=True)
class ClipAttention:
    """One recorded forward of a clip: the encoder's ``output`` (transformers' ``BaseModelOutputWithPooling``),
    ``temporal[layer]`` the temporal layer's post-softmax attention ``(B, H, rows, 1 + F)`` over the CLS and the
    ``F`` frames, ``spatial[layer]`` the trunk layer's ``(B, F, H', rows, T)`` over each frame's own ``T`` tokens
    (its prefix, then its patches), and ``frame`` where a frame's tokens sit."""

    output: object
    temporal: dict[int, torch.Tensor]
    spatial: dict[int, torch.Tensor]
    frame: LibraryLayout
    probe: torch.Tensor | None = None  # (B, F, H', latents, T): each frame's attention-pooling head, where asked

    def placed_probe(self, head: int | None = None) -> torch.Tensor:
        """Each frame's attention-pooling head (what its frame vector reads) laid on its grid ``(B, frames, rows,
        cols)``: its latent queries' mean row over the frame's patches (the prefix keys left out); ``head`` None: the
        mean of the heads."""
        if self.probe is None:
            raise ValueError("the pooling probe was not recorded: record(..., probe=True)")
        gh, gw = self.frame.grid
        probabilities = self.probe if head is None else self.probe[:, :, head:head + 1]
        rows = probabilities[..., self.frame.num_prefix_tokens:].mean((2, 3))  # (B, F, gh*gw)
        return rows.reshape(rows.shape[0], rows.shape[1], gh, gw)

    def placed(self, layer: int, query: int | tuple[int, int, int] = 0, head: int | None = None,
               temporal: bool = False) -> torch.Tensor:
        """A row of the attention laid on the frames' grids ``(B, frames, rows, cols)``; ``head`` None: the mean of
        the heads. ``temporal``: the temporal layer ``layer``'s row of token ``query`` (0 the CLS, ``1 + f`` frame
        ``f``), each frame's weight over its whole grid. Else the trunk layer ``layer``'s row of ``query``: an int
        is a frame token (0 the CLS), its row in every frame, over that frame's patches (the prefix keys left
        out); ``(frame, row, col)`` that frame's patch, its row over its own frame, the other frames 0."""
        gh, gw = self.frame.grid
        if temporal:
            probabilities = self.temporal[layer]  # (B, H, 1 + F, 1 + F)
            row = probabilities[:, :, query] if head is None else probabilities[:, head, query][:, None]
            weights = row.mean(1)[:, TEMPORAL_PREFIX:]  # (B, F)
            return weights[:, :, None, None].expand(-1, -1, gh, gw).clone()
        return self.on_frames(self.spatial[layer], query, head)

    def on_frames(self, probabilities: torch.Tensor, query: int | tuple[int, int, int] = 0,
                  head: int | None = None) -> torch.Tensor:
        """Each frame's ``(B, F, H, T, T)`` attention (a trunk layer's, or a rollout of them with ``H`` 1), its row of
        ``query`` laid on the frames' grids ``(B, frames, rows, cols)`` as ``placed`` lays a trunk layer's."""
        gh, gw = self.frame.grid
        if head is not None:
            probabilities = probabilities[:, :, head:head + 1]
        prefix = self.frame.num_prefix_tokens
        if isinstance(query, tuple):
            frame, r, c = query
            rows = probabilities[:, frame, :, prefix + r * gw + c, prefix:].mean(1)  # (B, gh*gw)
            out = probabilities.new_zeros(probabilities.shape[0], probabilities.shape[1], gh, gw)
            out[:, frame] = rows.reshape(-1, gh, gw)  # row-major: the patch grid as the trunk flattens it
            return out
        rows = probabilities[:, :, :, query, prefix:].mean(2)  # (B, F, gh*gw)
        return rows.reshape(rows.shape[0], rows.shape[1], gh, gw)


class PeVideoLibraryModel(LibraryModel):
    """transformers' ``PeVideoEncoder`` as transformers builds it, a clip ``(B, F, C, H, W)`` in. Its temporal
    layers are the ``LibraryModel``'s layers (``num_layers``, ``num_heads``, ``run``); ``frames`` is the trunk as
    timm's library road holds it (``timm_models.TimmLibraryModel``: one frame an image), whose ``layout`` places a
    frame's tokens; ``num_frames`` the clip length its video processor samples."""

    takes_clips = True
    samples_ends = True  # PeVideoVideoProcessor samples a clip from its first frame to its last (read_clip's ends)

    def __init__(self, model: torch.nn.Module, frames: timm_models.TimmLibraryModel,
                 temporal_modules: list[torch.nn.Module], num_frames: int):
        super().__init__(model, frames.layout, temporal_modules)
        self.__dict__["frames"] = frames  # its modules are the encoder's, registered once there
        self.num_frames = num_frames
        # the trunk's attention-pooling head (PE-Core's MAP: each frame's vector), recordable; None without one
        self.__dict__["pool"] = timm_models.pooling_head(frames.trunk)

    @property
    def is_classifier(self) -> bool:
        return False

    @property
    def num_frame_layers(self) -> int:
        return self.frames.num_layers

    def record(self, videos: torch.Tensor, layers: Iterable[int] = (), frame_layers: Iterable[int] = (),
               heads: list[int] | None = None, frame_heads: list[int] | None = None,
               probe: bool = False) -> ClipAttention:
        """The library's forward of ``videos`` ``(B, F, C, H, W)``, with the post-softmax attention of the asked
        temporal ``layers`` (every row) and trunk ``frame_layers`` (every frame, every row), and with ``probe`` each
        frame's attention-pooling head's (timm's explicit path's softmax); ``heads`` / ``frame_heads`` keep those
        heads alone. What is kept is checked against the memory limit first (``TooManyTokens``, one line)."""
        from vit.costs import plan

        if videos.dim() != 5:
            raise ValueError(f"PE video takes a clip (batch, frames, channels, height, width), not a tensor of shape "
                             f"{tuple(videos.shape)}, and has no classifier to predict with: draw a clip's maps with "
                             "vit.explain(vit.load(folder), clip, method)")
        B, F = videos.shape[:2]
        temporal = sorted({layer % self.num_layers for layer in layers})
        spatial = sorted({layer % self.num_frame_layers for layer in frame_layers})
        gh, gw = self.layout.grid
        tokens = self.layout.num_prefix_tokens + gh * gw
        if temporal:
            plan.decide(plan.library_attention(B, self.num_heads if heads is None else len(heads),
                                               TEMPORAL_PREFIX + F, len(temporal)))
        if spatial:
            plan.decide(plan.library_attention(B * F, self.frames.num_heads if frame_heads is None
                                               else len(frame_heads), tokens, len(spatial)))
        over_time = _AttentionRecorder({layer: self._attention[layer] for layer in temporal}, heads, None)
        if probe and self.pool is None:
            raise ValueError("its frames' trunk has no attention-pooling head (attn_pool) to record")
        pooled = self.num_frame_layers  # the pool's key in the trunk's recorder: it reads the last block's output
        within = _AttentionRecorder({layer: self.frames.attention_module(layer) for layer in spatial}
                                    | ({pooled: self.pool} if probe else {}), frame_heads, None)
        with torch.no_grad(), recording_attention.recording(self.model, over_time), timm_models.recording(within):
            output = self.model(pixel_values_videos=videos)
        pool = within.kept.pop(pooled, None)
        for layer, kept in over_time.kept.items():
            if kept.shape[-1] != TEMPORAL_PREFIX + F:
                raise ValueError(f"temporal layer {layer}'s attention has {kept.shape[-1]} keys, not the CLS and "
                                 f"{F} frames")
        for layer, kept in within.kept.items():
            if kept.shape[0] != B * F or kept.shape[-1] != tokens:
                raise ValueError(f"trunk layer {layer}'s attention is over {kept.shape[-1]} tokens, not the "
                                 f"{self.layout.num_prefix_tokens} prefix tokens and {gh}x{gw} patches of a frame")
        return ClipAttention(output, dict(sorted(over_time.kept.items())),
                             {layer: kept.reshape(B, F, *kept.shape[1:]) for layer, kept in sorted(
                                 within.kept.items())}, self.layout,  # (B*F, ...) -> (B, F, ...)
                             None if pool is None else pool.reshape(B, F, *pool.shape[1:]))

    def run(self, videos: torch.Tensor, layers: Iterable[int] = (), heads: list[int] | None = None,
            rows: list[int] | None = None) -> tuple[object, dict[int, torch.Tensor]]:
        """``LibraryModel.run`` over a clip ``(B, F, C, H, W)``: the encoder's output and the asked temporal
        layers' attention ``(B, heads, rows, 1 + F)``."""
        recorded = self.record(videos, layers, heads=heads)
        if rows is None:
            return recorded.output, recorded.temporal
        return recorded.output, {layer: kept[:, :, rows] for layer, kept in recorded.temporal.items()}

    def forward(self, videos: torch.Tensor) -> torch.Tensor:
        """The clip's embedding ``(B, hidden)``: the encoder's ``pooler_output`` (its CLS after the last layer)."""
        return self.record(videos).output.pooler_output


def video_processor(folder: Path) -> dict | None:
    """The folder's video processor settings (``video_preprocessor_config.json``, else ``processor_config.json``'s
    ``video_processor``: what a ``PeVideoProcessor``'s save_pretrained writes), else None."""
    from vit.sources.files import read_json

    if (folder / VIDEO_PROCESSOR).is_file():
        return read_json(folder / VIDEO_PROCESSOR)
    nested = read_json(folder / "processor_config.json").get("video_processor") if (
        folder / "processor_config.json").is_file() else None
    return dict(nested) if isinstance(nested, Mapping) else None


def open_library(folder: Path, config_json: Mapping, image_processor: Mapping | None = None,
                  map_location: str | torch.device = "cpu") -> Checkpoint:
    """The folder's ``PeVideoEncoder`` (a ``PeVideoModel``'s ``video_encoder``: its text model is not kept) as
    transformers builds it (``PeVideoLibraryModel``), in a ``Checkpoint`` with ``road="library"``: the frames
    prepared as its video processor says (``video_processor``, else ``image_processor``), its trunk's layout read off
    timm's patch embedding and checked on the meta device. SourceError (one line) for what cannot be opened or
    placed."""
    import transformers

    model_type = str(config_json.get("model_type"))
    origin = f"{folder} ({model_type}, opened as transformers builds it)"
    video = config_json.get("video_config") if model_type == "pe_video" else config_json
    problem = declared_problem(config_json)
    vision = video.get("vision_config") if isinstance(video, Mapping) else None
    args = vision.get("model_args") if isinstance(vision, Mapping) else None
    problem = problem or (timm_models._declared_problem(args) if isinstance(args, Mapping) else None)
    if problem:
        raise SourceError(f"{origin}: {problem}")
    meta = torch.device(map_location).type == "meta"
    name = recording_attention.recording_name("sdpa")
    try:  # as the library road reads any class (read_class); PE's own modelling asserts what its config declares
        config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
        model = read_class(getattr(transformers, MODEL_TYPES[model_type]), config, folder, origin, map_location,
                           attn_implementation=name)
    except SourceError:
        raise
    except (*library_errors(), AssertionError) as e:
        raise SourceError(f"{origin}: {library_error_line(e)}") from None
    model = model.eval() if model_type == "pe_video_encoder" else model.video_encoder.eval()
    trunk = getattr(getattr(model.embedder, "vision_model", None), "timm_model", None)
    if not isinstance(trunk, torch.nn.Module):
        raise SourceError(f"{origin}: its frame encoder is no timm model (vision_config's architecture); the library "
                          "road records a timm trunk's attention")
    temporal = [layer.self_attn for layer in model.layers]
    processor = video_processor(folder) or image_processor
    num_frames = processor.get("num_frames") if isinstance(processor, Mapping) else None
    if num_frames is not None and not (isinstance(num_frames, int) and not isinstance(num_frames, bool)
                                       and 1 <= num_frames <= MAX_FRAMES):
        raise SourceError(f"{folder}: its video processor's num_frames {str(num_frames)[:20]} is not a frame count "
                          f"from 1 to {MAX_FRAMES}; fix {VIDEO_PROCESSOR}")
    frames, preprocessing = _frame_model(origin, folder, trunk, processor, meta)
    wrapped = PeVideoLibraryModel(model, frames, temporal, num_frames or DEFAULT_FRAMES)
    if meta:
        problem = _clip_problem(wrapped)
        if problem:
            raise SourceError(f"{origin}: {problem}")
    architecture = f"hf:{MODEL_TYPES[model_type]}"
    metadata = {"source": {"kind": "hf", "path": str(folder), "architecture": architecture},
                "architecture": architecture, "parameters": sum(p.numel() for p in model.parameters()),
                "road": ROAD}
    if num_frames is None:
        metadata["preprocessing_guessed"] = (
            f"Its video processor names no num_frames (it would take every frame), so a clip is sampled to "
            f"{DEFAULT_FRAMES} frames.")
    return Checkpoint(model=wrapped, class_names=[], preprocessing=preprocessing, metadata=metadata,
                      path=folder, road=ROAD)


def _frame_model(origin: str, folder: Path, trunk: torch.nn.Module, processor: Mapping | None, meta: bool
                 ) -> tuple[timm_models.TimmLibraryModel, Preprocessing]:
    """The trunk as timm's library road holds it (its attention made recordable, its layout read off its patch
    embedding and checked on the meta device), and each frame's preparation as the video processor says."""
    checkpoint = timm_models._checkpoint(folder, origin, trunk, trunk,
                                         lambda stand_in: hf_preprocessing(processor, stand_in, "PeVideoEncoder"),
                                         [], "hf", "hf:PeVideoEncoder", meta)
    return checkpoint.model, checkpoint.preprocessing


def _clip_problem(model: PeVideoLibraryModel) -> str | None:
    """Why the temporal layers do not run over the CLS and one token a frame (the encoder's forward on the meta
    device, a clip of ``num_frames`` frames: shapes only), or None."""
    h, w = model.layout.image_hw
    frames = min(model.num_frames, 4)
    videos = torch.empty(1, frames, 3, h, w, device="meta")
    layers: list[tuple[int, int]] = []  # (temporal layer, keys)
    try:
        traced_key_counts(model, model.model, lambda: model.model(pixel_values_videos=videos), layers)
    except (RuntimeError, ValueError, TypeError, NotImplementedError, IndexError, AssertionError) as e:
        return f"its forward cannot be traced on the meta device to check where its tokens sit ({_one_line(e)})"
    seen = [keys for _, keys in layers]
    if len(seen) != model.num_layers or set(seen) != {TEMPORAL_PREFIX + frames}:
        return (f"its temporal attention runs over {sorted(set(seen)) or 'no recorded'} tokens, not the CLS and "
                f"{frames} frames the library road places")
    return None
