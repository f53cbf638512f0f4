"""The library road's model: a library's own vision model, its attention recorded (``LibraryModel``), and where its
tokens sit on the image (``LibraryLayout``). The recorders that keep what a view asks (``_AttentionRecorder``, and
``_GradientRecorder`` with autograd) are handed each asked layer's probabilities by transformers' recording attention
(``vit.core.recording_attention``), by timm's explicit path, or by the recorder at the attention function
(``vit.core.attention_recorder``). How a transformers folder is read and built into one is
``transformers_models``'; a timm model's ``timm_models``'; any module's ``recorded_road``'s."""

from __future__ import annotations

import contextvars
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from vit.core import recording_attention
from vit.model.stages import LayerLayout, layer_on_grid, layer_rows

ROAD = "library"  # Checkpoint.road of a model opened here; "port" of our own ViT

@dataclass(frozen=True)
class LibraryLayout:
    """Where a library model's tokens sit on the image: ``num_prefix_tokens`` tokens first (CLS, registers), then
    the patches of a ``grid`` (rows, cols) row-major, each ``patch_hw`` pixels of an ``image_hw`` input."""

    num_prefix_tokens: int
    patch_hw: tuple[int, int]
    image_hw: tuple[int, int]
    # Tokens a layer's attention has before its prefix tokens, layer by layer, where some layers have more (EoMT's
    # object queries in its last blocks); empty: none in any layer. A token keeps its index of the layout (0 is
    # CLS, patch p is p + num_prefix_tokens) in every layer: a layer's row of it is its index plus the layer's extra
    # tokens.
    extra_tokens: tuple[int, ...] = ()
    num_suffix_tokens: int = 0  # tokens after the patches in every layer (YOLOS's detection tokens)
    # Each layer's window side in patches where some layers attend in windows (SAM 3's ViTDet layers: the grid padded
    # at its bottom and right to a multiple of the window, cut row-major, each window's attention its own
    # ``(B * windows, H, w*w, w*w)``), 0 for a global layer; empty: every layer global. A windowed layer's attention
    # is placed on the grid (``vit.model.stages.layer_on_grid``: zero outside the query's window) before it is kept.
    windows: tuple[int, ...] = ()

    def extra_of(self, layer: int) -> int:
        """The tokens layer ``layer`` has before the layout's prefix tokens (0 in most models)."""
        return self.extra_tokens[layer] if self.extra_tokens else 0

    def layer_layout(self, layer: int, grid: tuple[int, int]) -> LayerLayout | None:
        """Layer ``layer``'s windows on a ``grid`` of patches (``LayerLayout``), None for a global layer."""
        window = self.windows[layer] if self.windows else 0
        return LayerLayout(tuple(grid), window) if window else None

    def keys_of(self, layer: int) -> int:
        """The keys layer ``layer``'s attention has as the library computes it: a window's ``w*w``, else every
        token (its extra tokens too)."""
        window = self.windows[layer] if self.windows else 0
        return window * window if window else self.num_tokens + self.extra_of(layer)

    @property
    def grid(self) -> tuple[int, int]:
        return self.image_hw[0] // self.patch_hw[0], self.image_hw[1] // self.patch_hw[1]

    @property
    def num_tokens(self) -> int:
        gh, gw = self.grid
        return self.num_prefix_tokens + gh * gw + self.num_suffix_tokens


class _AttentionRecorder:
    """What the recording attention hands the asked layers' calls to (``recording_attention.recording``): each
    layer's post-softmax probabilities ``(B, H, rows, T)``, formed once where the layer computes (over SDPA: the asked
    query rows alone, or every row and the output from them; over the eager function: its own), the asked heads
    and query rows alone kept."""

    gradient = False  # whether the forward it records runs with autograd (``_GradientRecorder``)
    heads_mean = False  # whether each layer's heads are kept as their mean (``LibraryModel.run``)

    def __init__(self, modules: Mapping[int, torch.nn.Module], heads: list[int] | None, rows: list[int] | None):
        self.layers = {module: layer for layer, module in modules.items()}
        self.modules = dict(modules)
        self.heads, self.rows = heads, rows
        self.rows_of: dict[int, list[int]] = {}  # a layer's own rows, where its extra tokens move them
        self.windows: dict[int, LayerLayout] = {}  # the windowed layers' layouts on the input's grid
        self.kept: dict[int, torch.Tensor] = {}

    def keep_probabilities(self, layer: int, probabilities: torch.Tensor, rows_formed: bool = False) -> None:
        """Layer ``layer``'s probabilities ``(B, H, T, T)``, the asked heads and query rows alone, kept;
        ``rows_formed``: they are ``(B, H, rows, T)``, the asked rows alone formed already (the module road's
        recorder, ``vit.core.attention_recorder``)."""
        if self.heads is not None:
            probabilities = probabilities[:, self.heads]
        rows = None if rows_formed else self.rows_of.get(layer, self.rows) if self.rows_of else self.rows
        if layer in self.windows and rows_formed:  # one piece's asked slots (``rows_for``): its keys placed
            keys = self.windows[layer].key_tokens()[0].to(probabilities.device)
            placed = probabilities.new_zeros(*probabilities.shape[:-1], self.windows[layer].num_key_tokens)
            placed[..., keys] = probabilities
            probabilities = placed
        elif layer in self.windows:  # (B * nw, H, n, n) -> (B, H, rows, T) on the grid, the asked rows alone formed
            probabilities = self.on_grid(layer, probabilities, rows)
        elif rows is not None:
            probabilities = probabilities[:, :, rows]
        if self.heads_mean:  # the heads' mean in float32, as the rollout fuses them (``fuse_heads``)
            probabilities = probabilities.detach().float().mean(1, keepdim=True)
        self.kept[layer] = probabilities.detach()

    def rows_for(self, layer: int, queries: int) -> list[int] | None:
        """The query rows a call of layer ``layer`` forms alone (``attention_recorder.formed_rows``; ``queries``, its
        query count, is read by pieces' recorders): the asked rows (None: every row); of a windowed layer, None (its
        windows formed whole), unless it is one piece an image holding every token in its own order (LW-DETR's and
        RF-DETR's global layer over their windows joined): the slots of the asked rows."""
        rows = self.rows_of.get(layer, self.rows) if self.rows_of else self.rows
        layout = self.windows.get(layer)
        if rows is None or layout is None:
            return rows
        queries, keys = layout.window_tokens(), layout.key_tokens()
        n = layout.num_tokens
        if queries.shape[0] != 1 or not torch.equal(queries, keys) or not torch.equal(
                queries[0].sort().values, torch.arange(n)) or n != layout.num_key_tokens:
            return None
        slot_of = torch.argsort(queries[0])  # token -> its slot
        return slot_of[torch.as_tensor(list(rows), dtype=torch.long)].tolist()

    def on_grid(self, layer: int, windows: torch.Tensor, rows: list[int] | None = None) -> torch.Tensor:
        """A windowed layer's ``(B * nw, H, n, n)`` placed on the input's grid: ``(B, H, rows, T)``, zero outside
        each query's window (every row where ``rows`` is None)."""
        layout = self.windows[layer]
        return layer_on_grid(windows, layout) if rows is None else layer_rows(windows, layout, rows)

    def output(self, layer, out) -> None:
        pass


class _GradientRecorder(_AttentionRecorder):
    """A recorder over a forward with autograd: each asked layer's probabilities ``(B, H, T, T)`` and, once the
    backward has run, their gradient ``gradients[layer]``, the same shape. Both roads hand it probabilities that are
    in the graph, the tensor the layer's output is computed from (timm's explicit path's; transformers' SDPA call
    computed once as ``softmax(q k^T * scale + mask) @ v``, ``vit.core.recording_attention``, dropout off in eval),
    whose gradient a hook takes as it passes: exactly what autograd gives through the eager function."""

    gradient = True

    def __init__(self, modules: Mapping[int, torch.nn.Module]):
        super().__init__(modules, None, None)
        self.gradients: dict[int, torch.Tensor] = {}

    def keep_probabilities(self, layer: int, probabilities: torch.Tensor, rows_formed: bool = False) -> None:
        if probabilities.requires_grad:
            def hook(grad: torch.Tensor) -> None:  # a windowed layer's (B * nw, H, n, n) placed on the grid
                grad = grad.detach()
                self.gradients[layer] = self.on_grid(layer, grad) if layer in self.windows else grad
            probabilities.register_hook(hook)
        super().keep_probabilities(layer, probabilities, rows_formed)


# The attention module whose input the current context reads (``LibraryModel.attention_inputs``), and where to keep it
_INPUTS: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("vit_library_inputs", default=None)


def _take_input(module, args, kwargs):
    """An attention module's forward pre-hook: where the current context reads this module's input, that input made
    a leaf (needing a gradient where asked) and kept; the module runs on the leaf."""
    asked = _INPUTS.get()
    if asked is None or asked[0] is not module:
        return None
    kept = asked[1]
    x = args[0] if args else kwargs["hidden_states"]
    leaf = x.detach().requires_grad_(bool(kept["gradients"]))
    kept["x"] = leaf
    return ((leaf, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": leaf})


# The blocks the current context passes over (``LibraryModel.legrad_gradients``): each hands its input on, so the
# model's own head reads the output of the layer before them
_LAST_LAYER: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("vit_library_last_layer", default=None)


def _pass_through(block, args, kwargs, output):
    """A block's forward hook: where the current context stops the model before this block, its input handed on in
    place of its output (a tuple's other items kept)."""
    asked = _LAST_LAYER.get()
    if asked is None or block not in asked:
        return None
    x = args[0] if args else kwargs["hidden_states"]
    if isinstance(output, torch.Tensor):
        return x
    if isinstance(output, tuple):
        return (x, *output[1:])
    raise ValueError(f"{type(block).__name__} returns a {type(output).__name__}; LeGrad cannot read an earlier "
                     "layer through the model's head")


class LibraryModel(torch.nn.Module):
    """A transformers vision model as transformers builds it, its attention through the recording function.
    ``model`` is the library's module (eval mode); ``layout`` places its tokens on the image."""

    road = ROAD
    @property
    def forms_asked_rows(self) -> bool:
        """Whether its recorder forms the asked query rows alone: over SDPA, yes (``vit.core.recording_attention``
        forms them at the SDPA call, as the module road's recorder does); over an eager function, its whole."""
        implementation = getattr(getattr(self.part, "config", None), "_attn_implementation", None)
        return implementation in ("sdpa", f"{recording_attention.ROWS}_sdpa")

    def __init__(self, model: torch.nn.Module, layout: LibraryLayout, attention_modules: list[torch.nn.Module],
                 part: torch.nn.Module | None = None, entry: torch.nn.Module | None = None):
        super().__init__()
        self.model = model
        self.layout = layout
        self._attention = attention_modules  # a plain list: the modules are the model's, registered once there
        # the pretrained model whose attention is routed through the recording function: the whole model, or the
        # backbone a head wraps (Depth Anything's DINOv2), a plain attribute: it is a module of ``model``
        self.__dict__["part"] = model if part is None else part
        # the module whose forward a recording runs: the whole model, or the vision encoder of a model whose own
        # forward needs prompts (SAM 3 tracker's: its prompt half runs in ``vit.segment``)
        self.__dict__["entry"] = model if entry is None else entry

    @property
    def config(self):
        """The library's config (``PretrainedConfig``)."""
        return self.model.config

    @property
    def num_layers(self) -> int:
        return len(self._attention)

    @property
    def vision_config(self):
        """The config of the recorded layers: the part's, or its backbone's where the part wraps one (SAM 3's
        vision encoder and its ViT)."""
        config = self.part.config
        return config if hasattr(config, "num_attention_heads") else _inner_config(config)

    @property
    def num_heads(self) -> int:
        return int(self.vision_config.num_attention_heads)

    @property
    def num_prefix_tokens(self) -> int:
        return self.layout.num_prefix_tokens

    @property
    def is_classifier(self) -> bool:
        return type(self.model).__name__.endswith("ForImageClassification")

    @property
    def no_gradient(self) -> str | None:
        """Why no gradient passes from the model's output back to its pixels, as the module its recording runs
        declares it (``ColourTokens``': ImageGPT's pixels looked up as colour ids), or None: a gradient passes."""
        return getattr(self.entry, "no_gradient", None)

    def input_grid(self, pixels: torch.Tensor) -> tuple[int, int]:
        """The patch grid of ``pixels`` (B, C, H, W): the layout's own, or an image's own where each is sized by
        itself (DPT's keep-aspect resize)."""
        return grid_of(self.layout, pixels.shape[-2:])

    def patch_grid(self, height: int, width: int) -> tuple[int, int]:
        """The patch grid of a ``height`` x ``width`` input (the port's ``ViT.patch_grid``)."""
        return grid_of(self.layout, (height, width))

    def attention_module(self, layer: int) -> torch.nn.Module:
        """Layer ``layer``'s attention module (the one that calls transformers' attention interface)."""
        return self._attention[layer]

    def run(self, pixels: torch.Tensor, layers: Iterable[int] = (), heads: list[int] | None = None,
            rows: list[int] | None = None, heads_mean: bool = False) -> tuple[object, dict[int, torch.Tensor]]:
        """The library's forward of ``pixels`` (B, C, H, W): its own output (``logits`` of a classifier,
        ``last_hidden_state`` ...), and for each of ``layers`` the post-softmax attention ``(B, heads, rows, T)``
        (every head and query row when not given), equal to ``output_attentions=True``'s; ``heads_mean``: the
        heads' mean kept instead, ``(B, 1, rows, T)``, as each layer is recorded (the rollout's factor: a head's worth
        of memory a layer). What is kept is checked against the memory limit first (``TooManyTokens``, one line)."""
        from vit.costs import plan

        L = self.num_layers
        asked = sorted({layer % L for layer in layers})
        gh, gw = grid_of(self.layout, pixels.shape[-2:])
        tokens = self.layout.num_prefix_tokens + gh * gw + self.layout.num_suffix_tokens
        if asked:
            plan.decide(plan.library_attention(pixels.shape[0], self.num_heads if heads is None else len(heads),
                                               tokens, len(asked), None if rows is None else len(rows), heads_mean,
                                               self.forms_asked_rows and not any(
                                                   self.layout.layer_layout(layer, (gh, gw)) for layer in asked)))
        extra = {layer: self.layout.extra_of(layer) for layer in asked}
        if rows is not None and any(extra.values()):  # a layer with extra tokens first: each row moved past them
            recorder = _AttentionRecorder({layer: self._attention[layer] for layer in asked}, heads, None)
            recorder.rows_of = {layer: [row + extra[layer] for row in rows] for layer in asked}
        else:
            recorder = _AttentionRecorder({layer: self._attention[layer] for layer in asked}, heads, rows)
        recorder.heads_mean = heads_mean
        out = self._recorded_forward(pixels, recorder)
        for layer, kept in recorder.kept.items():
            if kept.shape[-1] != tokens + extra[layer]:
                raise ValueError(f"layer {layer}'s attention has {kept.shape[-1]} keys; the layout places "
                                 f"{extra[layer] or ''}{' extra tokens, ' if extra[layer] else ''}"
                                 f"{self.layout.num_prefix_tokens} prefix tokens and {gh}x{gw} patches")
        return out, dict(sorted(recorder.kept.items()))

    def class_gradients(self, pixels: torch.Tensor, class_index: int | None, layers: Iterable[int]
                        ) -> tuple[torch.Tensor, dict[int, torch.Tensor], dict[int, torch.Tensor]]:
        """A classifier's logits ``(B, classes)`` for ``pixels`` (B, C, H, W), and for each of ``layers`` its
        post-softmax attention ``(B, H, T, T)`` and the gradient of the class logit (``class_index``; None: each
        image's predicted class) with respect to it: what ``class_gradients`` of the port gives for Chefer's
        gradient rollout, here through the library's own forward and backward. Checked against the memory limit
        first (one line)."""
        from vit.costs import plan

        if not self.is_classifier:
            raise ValueError("a class's gradients need a classifier: this model has none")
        L = self.num_layers
        asked = sorted({layer % L for layer in layers})
        gh, gw = grid_of(self.layout, pixels.shape[-2:])
        plan.decide(plan.library_gradient(self.cost_shape(), (gh, gw), "The class-specific map", len(asked)))
        recorder = _GradientRecorder({layer: self._attention[layer] for layer in asked})
        with torch.inference_mode(False), torch.enable_grad():
            pixels = pixels.detach().clone().requires_grad_(True)  # the graph even where the weights are frozen
            logits = self._recorded_forward(pixels, recorder).logits
            index = logits.argmax(-1) if class_index is None else torch.full(
                (logits.shape[0],), int(class_index), device=logits.device)
            # each image its own logit's; the pixels' own gradient is not read (ImageGPT's colour ids: none)
            torch.autograd.grad(logits.gather(1, index[:, None]).sum(), pixels, allow_unused=True)
        missing = [layer for layer in asked if layer not in recorder.gradients]
        if missing:
            raise ValueError(f"layers {missing}' attention does not reach the class logit; no gradient to weigh it")
        return logits.detach(), dict(sorted(recorder.kept.items())), dict(sorted(recorder.gradients.items()))

    def attention_inputs(self, pixels: torch.Tensor, layer: int, class_index: int | None = None,
                         gradients: bool = True) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """The tokens layer ``layer``'s attention module reads ``(B, T, D)`` (a pre-norm block's first norm's output:
        pytorch-grad-cam's ViT tutorial's ``norm1``), with ``gradients`` the gradient of each image's class logit
        (``class_index``; None: the predicted one) with respect to them, and the logits (None without a classifier).
        They are read as the module's input in this context only (``_INPUTS``), made a leaf there: the gradient
        stops at the layer."""
        from vit.costs import plan

        if gradients and not self.is_classifier:
            raise ValueError("a class's gradients need a classifier: this model has none")
        if gradients:
            plan.decide(plan.library_gradient(self.cost_shape(), grid_of(self.layout, pixels.shape[-2:]), "A CAM"))
        module = self._attention[layer % self.num_layers]
        if not getattr(module, "_vit_inputs_hooked", False):
            module.register_forward_pre_hook(_take_input, with_kwargs=True)
            module._vit_inputs_hooked = True
        kept: dict[str, torch.Tensor] = {"gradients": gradients}
        token = _INPUTS.set((module, kept))
        try:
            with torch.inference_mode(False):
                recorder = _GradientRecorder({}) if gradients else _AttentionRecorder({}, None, None)
                out = self._recorded_forward(pixels.detach().clone(), recorder)
                logits = out.logits if self.is_classifier else None
                grad = None
                if gradients:
                    index = logits.argmax(-1) if class_index is None else torch.full(
                        (logits.shape[0],), int(class_index), device=logits.device)
                    [grad] = torch.autograd.grad(logits.gather(1, index[:, None]).sum(), kept["x"])
        finally:
            _INPUTS.reset(token)
        tokens = self._on_grid(layer % self.num_layers, kept["x"].detach(), pixels.shape[-2:])
        grad = None if grad is None else self._on_grid(layer % self.num_layers, grad, pixels.shape[-2:])
        return tokens, grad, None if logits is None else logits.detach()

    def _on_grid(self, layer: int, x: torch.Tensor, image_hw) -> torch.Tensor:
        """An attention module's input as ``(B, T, D)``, row-major on the grid: SAM 3's ``(B, gh, gw, D)`` flattened,
        a windowed layer's ``(B * nw, w, w, D)`` windows joined (``LayerLayout.join``, their padding dropped)."""
        x = x.flatten(1, -2)  # (B or B * nw, tokens, D)
        layout = self.layout.layer_layout(layer, grid_of(self.layout, image_hw))
        return x if layout is None else layout.join(x)

    def logits(self, pixels: torch.Tensor) -> torch.Tensor:
        """A classifier's logits ``(B, classes)`` of ``pixels`` (B, C, H, W), nothing recorded, in autograd's graph
        where it is on (captum's and RISE's forward; ``forward`` runs without a graph)."""
        if not self.is_classifier:
            raise ValueError("this model has no classifier: it gives no logits")
        recorder = _GradientRecorder({}) if torch.is_grad_enabled() else _AttentionRecorder({}, None, None)
        return self._recorded_forward(pixels, recorder).logits

    def cost_shape(self):
        """What the cost model reads of it (``vit.costs.plan.LibraryShape``): the recorded part's config's layers,
        heads, hidden and MLP widths (``intermediate_size``, else ``mlp_ratio`` x hidden), the prefix tokens, the
        patch and the channels."""
        from vit.costs.plan import LibraryShape

        config = self.vision_config
        hidden = int(config.hidden_size)
        mlp = getattr(config, "intermediate_size", None) or round(getattr(config, "mlp_ratio", 4) * hidden)
        return LibraryShape(self.num_layers, self.num_heads, hidden, int(mlp), self.layout.num_prefix_tokens,
                            self.layout.patch_hw, int(getattr(config, "num_channels", 3)))

    def blocks(self) -> list[torch.nn.Module]:
        """Each layer's block, in order: the nearest module above its attention module that is an item of a
        ``ModuleList`` or ``Sequential`` (transformers' ``layers.3``, timm's ``blocks.3``)."""
        names = {module: name for name, module in self.model.named_modules()}
        found = []
        for attention in self._attention:
            parts = names[attention].split(".")
            for i in range(len(parts) - 1, 0, -1):
                parent = self.model.get_submodule(".".join(parts[:i]))
                if isinstance(parent, (torch.nn.ModuleList, torch.nn.Sequential)) and parts[i].isdigit():
                    found.append(parent[int(parts[i])])
                    break
            else:
                raise ValueError(f"its attention module {names[attention]} is in no list of blocks")
        return found

    def legrad_gradients(self, pixels: torch.Tensor, class_index: int | None, layers: Iterable[int]
                         ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """LeGrad's gradients: for each of ``layers``, the model's own head reading that layer's output (the blocks
        after it pass their input on) and the gradient of its class logit (``class_index``; None: the class the
        whole model predicts) with respect to that layer's post-softmax attention ``(B, H, T, T)``; and the whole
        model's logits. One forward and backward per layer, each counted first (one line past the limit)."""
        from vit.costs import plan

        if not self.is_classifier:
            raise ValueError("LeGrad reads a class through the model's head: this model has no classifier")
        L = self.num_layers
        asked = sorted({layer % L for layer in layers}, reverse=True)  # the last first: its logits give the class
        plan.decide(plan.library_gradient(self.cost_shape(), grid_of(self.layout, pixels.shape[-2:]), "LeGrad", 1))
        blocks = self.blocks()
        for block in blocks:
            if not getattr(block, "_vit_pass_through", False):
                block.register_forward_hook(_pass_through, with_kwargs=True)
                block._vit_pass_through = True
        gradients, whole = {}, None
        for layer in asked:
            recorder = _GradientRecorder({layer: self._attention[layer]})
            token = _LAST_LAYER.set(set(blocks[layer + 1:]))
            try:
                with torch.inference_mode(False), torch.enable_grad():
                    x = pixels.detach().clone().requires_grad_(True)
                    logits = self._recorded_forward(x, recorder).logits
                    if whole is None:
                        whole = logits.detach()
                    index = whole.argmax(-1) if class_index is None else torch.full(
                        (logits.shape[0],), int(class_index), device=logits.device)
                    torch.autograd.grad(logits.gather(1, index[:, None]).sum(), x, allow_unused=True)
            finally:
                _LAST_LAYER.reset(token)
            if layer not in recorder.gradients:
                raise ValueError(f"layer {layer}'s attention does not reach the class logit; no gradient to read")
            gradients[layer] = recorder.gradients[layer]
        return whole, dict(sorted(gradients.items()))

    def _recorded_forward(self, pixels: torch.Tensor, recorder: _AttentionRecorder) -> object:
        """The library's forward of ``pixels``, the layers ``recorder`` lists recorded into it (with autograd where
        the recorder asks for gradients)."""
        grid = grid_of(self.layout, pixels.shape[-2:])
        recorder.windows = {layer: lay for layer in recorder.modules
                            if (lay := self.layout.layer_layout(layer, grid)) is not None}
        # DPT's neck cannot take a non-square grid (below): its ViT's own forward, whose attention the maps read
        entry = self.model.dpt if grid[0] != grid[1] and self.square_neck else self.entry
        with torch.set_grad_enabled(recorder.gradient), recording_attention.recording(self.part, recorder):
            return entry(pixel_values=pixels)

    @property
    def square_neck(self) -> bool:
        """Whether the model is a DPT with its own ViT, whose neck (transformers' ``DPTReassembleStage``, given no
        patch grid) reshapes the tokens to a square grid: a non-square input (its keep-aspect resize) fails there, in
        transformers too. Its ViT's attention computes fine: ``run`` reads it from the ViT alone."""
        config = getattr(self.model, "config", None)  # a module in hand (the recorded road's) may have none
        return (getattr(config, "model_type", None) == "dpt" and not getattr(config, "is_hybrid", False)
                and getattr(config, "backbone_config", None) is None and hasattr(self.model, "neck"))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """The logits of a classifier, else the last hidden states ``(B, T, hidden)``, else the head's first output
        (a depth model's ``predicted_depth``). ValueError in one line for DPT's depth of a non-square input."""
        gh, gw = grid_of(self.layout, pixels.shape[-2:])
        if gh != gw and self.square_neck:
            raise ValueError(f"DPT's neck reshapes its {gh}x{gw} patches to a square grid and fails on this "
                             f"{pixels.shape[-1]}x{pixels.shape[-2]} input (transformers' own does too); its "
                             "attention maps are drawn, and its depth of a square image")
        out = self.run(pixels)[0]
        if self.is_classifier:
            return out.logits
        return out.last_hidden_state if getattr(out, "last_hidden_state", None) is not None else out[0]


def grid_of(layout: LibraryLayout, image_hw) -> tuple[int, int]:
    """The patch grid of an input of ``image_hw`` pixels."""
    return int(image_hw[0]) // layout.patch_hw[0], int(image_hw[1]) // layout.patch_hw[1]


def _inner_config(config):
    """The sub-config a composite config keeps its vision layers in: its ``backbone_config`` (SAM 3's vision
    encoder's ViT), else its ``vision_config``'s ``backbone_config`` (SAM 3 tracker's); None where there is none."""
    inner = getattr(config, "backbone_config", None)
    if inner is None:
        inner = getattr(getattr(config, "vision_config", None), "backbone_config", None)
    return None if isinstance(inner, Mapping) else inner
