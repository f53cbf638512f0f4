"""A vision-language model opened whole from its own folder, to ask it a question: transformers' own model class for
the folder's architecture (``LlavaForConditionalGeneration``, ``Qwen2_5_VLForConditionalGeneration`` ...) with the
folder's weights, and its own processor (``AutoProcessor``: image processor, tokenizer and chat template), both
offline and without remote code, so the prompt, the image tokens and greedy generation are transformers' own.

Beside it, the tower as ``vit.load`` opens it (``vit.sources.open.open_vlm``), opened on the meta device: no weight of
it is read, only what places the language model's image tokens on the image (the patch grid, the projector's merge
unit, the prefix tokens the projector keeps), as the visual logit lens places them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from vit.checkpoint import Checkpoint, CheckpointError
from vit.core import lean_tower
from vit.core.recording_attention import (
    TOWER_PARTS,
    attention_of,
    computes_softmax,
    cross_layers,
    cross_module,
    cross_named,
    decoder_layers,
    decoder_of,
    inline_stack,
)
from vit.registry import VLM_ARCHITECTURES as ARCHITECTURES  # the model types this project names
from vit.registry import vlm_architecture
from vit.sources.build_bounds import bounded_build, built_on_meta, declared_number_problem
from vit.sources.files import (
    SourceError,
    library_error_line,
    library_errors,
    loading_problem,
    quiet_transformers,
    read_json,
)
from vit.sources.vlm.declared import DeclaredTower, special_floats
from vit.sources.weights_cover import weights_problem

TEXT_MODEL = ("idefics3", "smolvlm")  # whose decoder stack transformers names text_model


class VLMError(CheckpointError):
    """A folder whose whole vision-language model cannot be opened; the message says why and what to do."""


@dataclass
class VLM:
    """A vision-language model opened whole: transformers' model and processor, and our tower's layout."""

    folder: Path
    model_type: str
    model: torch.nn.Module  # transformers' ...ForConditionalGeneration, eval mode
    processor: object  # transformers' processor of the folder (image processor, tokenizer, chat template)
    # our tower opened on the meta device (its config and layout, no weights), or, for a tower no port here reads,
    # what its config declares (``DeclaredTower``): the answer reads only where the image tokens sit and its size
    tower: Checkpoint | DeclaredTower
    # its attention code tests the implementation's name (``_branches_on_the_name``): recorded under a name equal to
    # the one it wraps too (``recording_attention.SameBranch``), so it takes the branch it takes without recording
    same_branch: bool = False
    # its attention hands its function what only its own eager function reads (Inkling's per-query sinks and
    # relative position bias): recorded over that function, its own probabilities kept (``vlm_attention.recording``)
    own_probabilities: bool = False

    @property
    def unit(self) -> int:
        """Patches per image token along each side (``word_embeddings.projector_unit``: Qwen-VL's merge unit, ...)."""
        if isinstance(self.tower, DeclaredTower):
            return self.tower.unit
        from vit.sources.vlm.word_embeddings import projector_unit

        return projector_unit(self.tower)

    @property
    def patch_hw(self) -> tuple[int, int]:
        """The tower's patch (height, width) in pixels."""
        if isinstance(self.tower, DeclaredTower):
            return self.tower.shape.patch_hw
        return tuple(self.tower.model.config.patch_hw)

    @property
    def tower_shape(self):
        """What the cost model reads of the tower: our ViT on the meta device, or a declared tower's
        ``plan.LibraryShape``."""
        return self.tower.shape if isinstance(self.tower, DeclaredTower) else self.tower.model

    @property
    def language_model(self) -> torch.nn.Module:
        """The decoder stack (``model.model.language_model``, Idefics3's ``text_model``): its
        ``layers[i].self_attn`` are what the answer's attention reads."""
        inner = getattr(self.model, "model", self.model)  # Llama 4's parts sit on the generating model itself
        named = ("text_model",) if self.model_type in TEXT_MODEL else ("language_model", "text_model")
        stack = next((getattr(inner, name) for name in named if getattr(inner, name, None) is not None), None)
        if stack is None:  # by what it has: an encoder-decoder's decoder (Pix2Struct's, a VisionEncoderDecoder's),
            # else the inner model's own decoder layers (Idefics': its self-attention layers beside its cross ones)
            stack = decoder_of(self.model) or (inner if inner is not self.model and decoder_layers(inner) is not None
                                               and cross_layers(inner) is not None else None)
            # else a text stack whose attention computes its softmax itself (GIT's, BLIP's text decoder's)
            stack = stack or inline_stack(self.model)
            if stack is not None:
                return stack
        if stack is None and isinstance(getattr(inner, "layers", None), torch.nn.ModuleList) and hasattr(
                inner, "embed_tokens"):  # the decoder's layers on the model itself, beside its image tokenizer
            stack = inner  # (Chameleon's ChameleonModel: embed_tokens, layers, vqmodel)
        if stack is None:
            raise VLMError(f"{self.folder}'s {type(self.model).__name__} has no language_model or text_model: no "
                           "decoder stack whose attention the answer reads")
        if getattr(stack.config, "is_encoder_decoder", False):  # Florence-2's BART: the decoder writes the answer
            return stack.get_decoder()
        stack = getattr(stack, "model", stack)  # Llama 4's language model is a ...ForCausalLM around its stack
        if not hasattr(stack, "layers") and hasattr(stack, "get_decoder"):  # OPT's (BLIP-2's): model.decoder.layers
            decoder = stack.get_decoder()
            stack = decoder if hasattr(decoder, "layers") else stack
        return stack

    @property
    def device(self) -> torch.device:
        """Where the inputs go: the model's one device, or, placed across devices (``device_map``), the device its
        first module runs on (accelerate's hooks move each module's weights there as it runs)."""
        placed = getattr(self.model, "hf_device_map", None)
        if placed:
            first = next((d for d in placed.values() if d not in ("cpu", "disk", "meta")), "cpu")
            return torch.device(f"cuda:{first}" if isinstance(first, int) else first)
        return next(self.model.parameters()).device

    def __repr__(self) -> str:
        return f"VLM({self.model_type}, {self.folder})"


def folder_of(source: str | os.PathLike | Checkpoint) -> Path:
    """The VLM folder ``source`` names: a folder path, a Hub id (``org/name[@revision]``: its snapshot in the HF
    cache, downloaded when it is not there, every shard, since the language model is read too; its size checked
    against the download bound first), or the checkpoint ``vit.load`` opened from a folder. HubError (one line) when
    the Hub cannot give it."""
    path = source.path if isinstance(source, Checkpoint) else source
    if path is not None and not isinstance(source, Checkpoint):
        from vit.sources import hub

        path = hub.resolve(path)
    folder = Path(path).expanduser() if path is not None else None
    if folder is None or not (folder / "config.json").is_file():
        raise VLMError(f"{path} is no model folder with a config.json; give the folder of a vision-language model "
                       f"saved whole (a type of transformers' AutoModelForImageTextToText: "
                       f"{', '.join(ARCHITECTURES.values())}, ...)")
    return folder


def missing_weights(folder: Path) -> list[str]:
    """The weights files the shard index of ``folder`` lists that the folder lacks, sorted: a Hub download for the
    tower alone (``vit.predict``, the pages' "Open from the Hub") leaves the language model's shards on the Hub.
    ``[]`` when none is missing or there is no index."""
    from vit.sources.weights_files import shard_index

    index = shard_index(folder)
    return [] if index is None else sorted({shard for shard in index[1].values() if not (folder / shard).is_file()})


def architecture_of(folder: Path) -> tuple[str, str]:
    """``(model_type, architecture)`` of the generating VLM in ``folder``, from its config.json alone: a type of
    transformers' image-text-to-text auto-mapping (``registry.vlm_architecture``; the project's named ones,
    ``ARCHITECTURES``, among them). VLMError (one line) for another model or a bare model without a language-model
    head."""
    config_json = special_floats(read_json(folder / "config.json"))
    model_type = str(config_json.get("model_type"))
    architecture = vlm_architecture(model_type)
    if architecture is None:
        raise VLMError(f"{folder} is a {model_type[:40]!r} model, which transformers' image-text-to-text "
                       "auto-mapping (AutoModelForImageTextToText) does not hold; asking a question reads a "
                       f"generating vision-language model: {', '.join(ARCHITECTURES)}, ...")
    named = config_json.get("architectures") or [architecture]
    wrong = None if architecture in named else other_class_problem(str(named[0]), architecture, model_type)
    if wrong:
        raise VLMError(f"{folder} holds a {str(named[0])[:60]}, {wrong}")
    return model_type, architecture


def other_class_problem(named: str, architecture: str, model_type: str) -> str | None:
    """Why a folder whose config.json names the class ``named``, not ``architecture`` (the generating class the
    auto-mapping gives its ``model_type``), is not answered as ``architecture``, in words that follow "holds a
    {named}, ", or None: ``named`` is that class under another name (a subclass: Ernie 4.5 VL's deprecated alias), so
    its weights answer through it. A class with no ``generate`` (a bare model, BLIP's retrieval head) has no
    language-model head; one that generates its own way (BLIP's question answerer, whose decoder reads its text
    encoder's states over the question) is not the class the answer's rows are read through."""
    import transformers

    cls, mapped = getattr(transformers, named, None), getattr(transformers, architecture, None)
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
        cls = None
    if cls is not None and isinstance(mapped, type) and issubclass(cls, mapped):
        return None
    if cls is None or not cls.can_generate():
        return f"which has no language-model head to answer with; open a {architecture}"
    return (f"which writes its answer through its own generate, not through {architecture} (the class transformers' "
            f"image-text-to-text auto-mapping opens for {model_type[:40]}), whose decoder's attention over the image "
            f"the answer's maps read; open a folder saved as a {architecture}")


def can_answer(source: str | os.PathLike | Checkpoint) -> bool:
    """Whether ``source`` (a folder, or ``vit.load``'s checkpoint of a tower) is a generating VLM's folder that
    ``open_whole_vlm`` opens, judged from its config.json alone (nothing else read)."""
    try:
        architecture_of(folder_of(source))
    except (VLMError, CheckpointError, OSError, ValueError):
        return False
    return True


DTYPES = {"auto": "auto", "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def open_whole_vlm(source: str | os.PathLike | Checkpoint | VLM, device: str | torch.device | None = None,
                   pan_and_scan: bool = False, *, device_map: str | dict | None = None,
                   max_memory: dict | None = None, offload_folder: str | os.PathLike | None = None,
                   dtype: str = "auto") -> VLM:
    """The whole VLM in ``source`` (its folder, or ``vit.load``'s checkpoint of its tower): transformers' model
    class for its architecture from the folder's weights and its processor, offline and without remote code.
    ``pan_and_scan``: Gemma 3's processor cuts a long image into crops beside the whole (``_pan_and_scan``).
    ``device_map`` (``"auto"``, or a dict of module names to devices, ``"cpu"`` or ``"disk"``), ``max_memory`` and
    ``offload_folder``: a model that does not fit one device, placed by accelerate across the GPUs present, its other
    layers offloaded to the CPU or to disk (each moved where it runs, as it runs); ``dtype``: "auto" (the weights'
    own), "float32", "bfloat16" or "float16". VLMError
    (one line) for a folder that is not one of ``ARCHITECTURES``, lacks a file, or declares a size past
    ``vit.sources.vlm.declared``'s bounds (counted before anything of it is built), and for weights files that lack
    a weight of the model or hold one of another size than its config's (``vit.sources.files.loading_problem``)."""
    if isinstance(source, VLM):
        if pan_and_scan:
            _pan_and_scan(source)
        return source
    if dtype not in DTYPES:
        raise VLMError(f"dtype must be one of {', '.join(DTYPES)}, got {str(dtype)[:40]!r}")
    if device_map is not None and device is not None:
        raise VLMError("give a device or a device_map (accelerate places the layers across devices), not both")
    folder = folder_of(source)
    model_type, architecture = architecture_of(folder)
    missing = missing_weights(folder)
    if missing:
        from vit.sources.hub import snapshot_of

        name = snapshot_of(folder)
        fetch = (f"open it by its Hub id, {name.repo_id}, to download them" if name is not None else
                 "copy them into the folder")
        raise VLMError(f"{folder} lacks {len(missing)} of the weights files its index lists ({missing[0]}"
                       f"{', ...' if len(missing) > 1 else ''}): its language model's, which a download for the "
                       f"tower alone leaves on the Hub; {fetch}")
    from vit.sources.open import open_source
    from vit.sources.vlm import declared

    config_json = declared.special_floats(read_json(folder / "config.json"))
    # before anything of it is built: whether its class answers in text at all, what the VLM's own files declare,
    # then any whole number under any other key
    wrong = (answering_problem(architecture) or declared.problem(folder, config_json)
             or declared_number_problem(config_json))
    if wrong:
        raise VLMError(f"{folder} is refused: {wrong}")

    import transformers

    try:  # the tower's layout: its config and shapes from the headers, no weight read; or what its config declares
        if model_type not in ARCHITECTURES:  # a type no layout here names: its tower as its config declares it
            from vit.sources.vlm.any_vlm import read_tower

            tower = read_tower(config_json)
        else:
            tower = declared.declared_tower(config_json) or open_source(folder, map_location="meta")
    except CheckpointError as e:
        raise VLMError(str(e)) from None
    except ValueError as e:
        raise VLMError(f"{folder} is refused: {e}") from None
    try:
        # on the meta device first, under the build's budget, its every tensor looked up in the weights' headers:
        # from_pretrained allocates what the config declares before it reads a weight
        cls = getattr(transformers, architecture)
        config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
        wrong = weights_problem(built_on_meta(cls, config, str(folder)), folder)
        if wrong:
            raise VLMError(f"{folder} is refused: {wrong}")
        processor = transformers.AutoProcessor.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
        # Mismatched sizes loaded at random, not raised: the loading info names them, for one line here (transformers'
        # own refusal is a RuntimeError pointing at the multi-line report it logs, kept quiet).
        placed = {} if device_map is None else dict(device_map=device_map, max_memory=max_memory,
                                                    offload_folder=offload_folder)
        with quiet_transformers(), bounded_build(str(folder), seconds=None):
            model, loaded = cls.from_pretrained(
                folder, local_files_only=True, trust_remote_code=False, dtype=DTYPES[dtype],
                ignore_mismatched_sizes=True, output_loading_info=True, **placed)
    except (VLMError, SourceError) as e:
        raise VLMError(str(e)) from None
    except library_errors() as e:  # ImportError: a processor needing a package this install lacks (it is named)
        raise VLMError(f"{folder}'s {architecture} or its processor cannot be opened by transformers: "
                       f"{library_error_line(e)}") from None
    wrong = loading_problem(loaded)
    if wrong:
        del model  # not kept alive by the refusal's traceback
        raise VLMError(f"{folder} is refused: {wrong}")
    if getattr(processor, "tokenizer", None) is not None and getattr(processor, "image_processor", None) is None \
            and getattr(processor, "video_processor", None) is not None:  # InstructBLIP Video's
        raise VLMError(f"{folder} is refused: its processor ({type(processor).__name__}) reads clips alone (a video "
                       "processor, no image processor); its model is asked about a clip, not an image")
    if getattr(processor, "tokenizer", None) is None or getattr(processor, "image_processor", None) is None:
        raise VLMError(f"{folder}'s processor has no tokenizer or image processor; save the model's processor "
                       "(processor.save_pretrained) into the folder")
    wrong = _token_objects(processor)
    if wrong:
        del model
        raise VLMError(f"{folder} is refused: {wrong}")
    if getattr(model.generation_config, "use_cache", True) is False and not type(
            model)._supports_default_dynamic_cache():  # else its answer is generated with a cache (the same tokens)
        del model
        raise VLMError(f"{folder} is refused: its generation_config.json sets use_cache false and its {architecture} "
                       "keeps no cache transformers' generate builds, whose keys the answer's maps read")
    model = (model if device_map is not None else model.to(device or "cpu")).eval()
    lean_tower.install(model)  # its tower's widest steps in bounded memory when it answers (no gradient)
    vlm = VLM(folder, model_type, model, processor, tower)
    if model_type not in ARCHITECTURES:
        wrong = attention_problem(vlm)
        if wrong:
            del model, vlm
            raise VLMError(f"{folder} is refused: {wrong}")
    if pan_and_scan:
        _pan_and_scan(vlm)
    return vlm


def answering_problem(architecture: str) -> str | None:
    """Why transformers' class ``architecture`` (of the image-text-to-text auto-mapping) cannot answer a question
    about an image in text, in one line, or None: a class with no ``generate`` (``can_generate()`` False: PI0's,
    which predicts a robot's actions by flow matching), or one whose forward takes no image (Mistral 4's causal
    language model)."""
    import inspect

    import transformers

    cls = getattr(transformers, architecture, None)
    if cls is None:
        return None  # transformers' own refusal to build it comes later, in one line
    if not cls.can_generate():
        return (f"transformers' {architecture} generates no text (its can_generate() is False: it has no "
                "generate to answer with)")
    parameters = inspect.signature(cls.forward).parameters
    if not any(part in name for name in parameters for part in ("pixel", "patch", "image")):  # Kosmos-2.5's patches
        other = next((name for name in parameters if name.endswith("_input_ids") and name != "decoder_input_ids"),
                     None)  # the ids of another input it reads instead (Evolla's protein sequences)
        return (f"transformers' {architecture} takes no image (its forward has no pixel_values, patches or image "
                "input" + (f"; it reads {other}" if other else "") + "); ask a model that does")
    return None


def attention_problem(vlm: VLM) -> str | None:
    """Why ``vlm``'s language model cannot answer through the recording attention, in one line, or None: its
    decoder stack, its layers' attention modules and its attention run through transformers' ``AttentionInterface``
    (``_supports_attention_backend``, or its attention modules' code asking the interface for its function: Qwen 3.5's
    model declines the flag for its linear-attention layers, its attention layers call the interface) are what the
    answer's rows are read from."""
    try:
        stack = vlm.language_model
    except VLMError as e:
        inline = _inline_attention(vlm.model)
        if inline is not None:  # a text attention that writes its own softmax (GIT's, BLIP's text decoder's)
            return (f"its language model's attention ({inline}) computes its softmax itself, not through "
                    "transformers' attention interface, which the answer's rows are read from")
        return str(e).split(": ", 1)[-1]
    layers = decoder_layers(stack)
    if layers is not None and all(attention_of(layer) is None for layer in layers) and stack is inline_stack(
            vlm.model):  # its rows recorded where its softmax is computed (vlm_attention.recording)
        return None
    if layers is None or not any(attention_of(layer) is not None or cross_named(layer) is not None
                                 for layer in layers):
        return (f"its language model ({type(stack).__name__}) has no layer with a self-attention (a self_attn, or a "
                "token mixer that asks transformers' attention interface) or a cross-attention whose attention the "
                "answer reads")
    crossing = cross_layers(stack)
    if crossing is not None and (decoder_of(vlm.model) is not None or crossing is not layers):
        # the answer's rows are its cross-attention's (an encoder-decoder's decoder, Idefics' gated layers)
        named = [cross_named(layer) for layer in crossing if cross_named(layer) is not None]
        calling = [cross_module(layer) for layer in crossing if cross_named(layer) is not None]
        if None in calling or not _calls_the_interface(calling, CROSS_KEYWORDS):
            return (f"its decoder's cross-attention ({type(named[0]).__name__}) does not run through transformers' "
                    "attention interface, which the answer's rows are read from")
        return None
    modules = [attention_of(layer) for layer in layers]
    vlm.same_branch = _branches_on_the_name(modules) is not None
    if not getattr(stack, "_supports_attention_backend", False) and not _calls_the_interface(modules):
        if _calls_the_interface(modules, keywords=None):  # with keywords only its eager function reads (Inkling's)
            vlm.own_probabilities = hasattr(stack, "set_attn_implementation")
            if vlm.own_probabilities:
                return None
        return (f"its language model's attention ({type(stack).__name__}) does not run through transformers' "
                "attention interface, which the answer's rows are read from")
    return None


def _inline_attention(model) -> str | None:
    """The class of the first attention module of ``model``'s text part (outside its tower's parts) that computes its
    softmax in its own forward rather than asking the attention interface (``computes_softmax``); None where there is
    none."""
    return next((type(module).__name__ for name, module in model.named_modules()
                 if not any(part in name for part in TOWER_PARTS) and computes_softmax(module)), None)


def _attention_code(modules):
    """``(attention module, its forward's source)`` for each of ``modules`` (None passed over) whose source can be
    read (a compiled or built-in forward is passed over): what the checks of its attention code read."""
    import inspect

    for attention in modules:
        if attention is None:
            continue
        try:
            yield attention, inspect.getsource(type(attention).forward)
        except (OSError, TypeError):
            continue


def _branches_on_the_name(modules) -> str | None:
    """The class of the first of the attention ``modules`` whose forward's code tests the attention
    implementation's name (``config._attn_implementation in ("eager", "sdpa")``: MiniMax-M3's and Mistral Large 4's
    sparse top-k masks, built only under those names and handed to flash kernels otherwise), else None: the
    recording attention then runs under a ``recording_attention.SameBranch`` name, so such a forward takes the branch
    it takes under the implementation the recording wraps (``VLM.same_branch``)."""
    import re

    for attention, code in _attention_code(modules):
        if re.search(r"_attn_implementation\s*(?:==|!=|in\b|not\s+in\b)", code):
            return type(attention).__name__
    return None


# The keywords every attention implementation reads alike: a call that hands the attention function others (Inkling
# 2's per-query sinks, which only its eager function adds) may compute otherwise under another implementation
PLAIN_KEYWORDS = {"dropout", "scaling", "sliding_window", "position_ids"}


# A cross-attention's call may hand T5's position bias too (Pix2Struct's, UDOP's: zeros over the encoder's states,
# which the recorder adds to its row as the eager function does)
CROSS_KEYWORDS = PLAIN_KEYWORDS | {"position_bias"}


def _calls_the_interface(modules, keywords=PLAIN_KEYWORDS) -> bool:
    """Whether any of the attention ``modules`` asks transformers' ``AttentionInterface`` for its attention function
    (``ALL_ATTENTION_FUNCTIONS.get_interface`` in its forward's code) and hands it nothing but the keywords every
    implementation reads alike (``keywords``: ``PLAIN_KEYWORDS``; None: any), as the recording attention needs."""
    import re

    for _attention, code in _attention_code(modules):
        call = re.search(r"attention_interface\((.*?)\n\s*\)", code, re.S)
        if "ALL_ATTENTION_FUNCTIONS" in code and call is not None:  # keywords None: whatever it hands
            return keywords is None or set(re.findall(r"(\w+)\s*=", call.group(1))) <= keywords
    return False


# The pan-and-scan settings Gemma 3's processor reads at each call (Gemma3Processor.images_kwargs)
PAN_AND_SCAN = ("pan_and_scan_min_crop_size", "pan_and_scan_max_num_crops", "pan_and_scan_min_ratio_to_activate")


def _pan_and_scan(vlm: VLM) -> None:
    """Turn on Gemma 3's pan-and-scan in ``vlm``'s processor: transformers' Gemma3Processor passes its own
    ``images_kwargs`` (pan-and-scan off, 256-px crops at least) to the image processor at each call, over the image
    processor's saved settings; here ``do_pan_and_scan`` and the image processor's own settings where it saved any
    (a checkpoint's are null: the processor's defaults stay). VLMError (one line) for another family."""
    if vlm.model_type != "gemma3":
        raise VLMError(f"pan-and-scan is Gemma 3's processor's; {vlm.folder} is a {vlm.model_type} model, ask it "
                       "without pan_and_scan")
    images = vlm.processor.image_processor
    saved = {key: getattr(images, key) for key in PAN_AND_SCAN if getattr(images, key, None) is not None}
    vlm.processor.images_kwargs = {**vlm.processor.images_kwargs, **saved, "do_pan_and_scan": True}


def _token_objects(processor) -> str | None:
    """A token the processor's code reads as the tokenizer's token object (``self.image_token.content``: InstructBLIP's)
    but that the folder's tokenizer config names as a plain string (real InstructBLIP folders' "image_token":
    "<image>"), on which transformers' processor fails with an AttributeError: made the token object the processor's
    own ``__init__`` makes when the tokenizer names none (not normalised, special), where the tokenizer's vocabulary
    holds it as one token (in place). What is wrong, in one line, where it does not; else None."""
    import inspect

    from tokenizers import AddedToken

    try:
        code = inspect.getsource(type(processor))
    except (OSError, TypeError):
        return None
    words = getattr(processor, "tokenizer", None)
    for name, value in list(vars(processor).items()):
        if not (name.endswith("_token") and isinstance(value, str) and f"self.{name}.content" in code):
            continue
        if words is None or words.convert_tokens_to_ids(value) in (None, words.unk_token_id):
            return (f"its tokenizer names {name} {value[:40]!r}, which its vocabulary lacks as one token: the image "
                    "would not be found in the prompt; save the tokenizer the model was made with into the folder")
        setattr(processor, name, AddedToken(value, normalized=False, special=True))
    return None
