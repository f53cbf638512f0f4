"""Any other from-scratch ViT: describe its state dict, draft a key mapping, apply a mapping strictly.

``vit.convert WEIGHTS --inspect`` prints ``draft_mapping``: a small JSON object with regular expressions from the
file's keys to ours (``keys``), the config fields its shapes tell (``config``; what they cannot tell, such as the
number of heads, is ``"?"``; defaults it guesses are named in ``guessed``), and the preprocessing to record; a
separate q, k or v layer maps to a third of our fused ``qkv`` (``blocks.\\1.attn.qkv.weight:q``), which is stacked
from the three. The user checks and completes it;
``vit.convert WEIGHTS --map mapping.json --out model.pt`` then applies it with ``apply_mapping``: every key must
be matched by a rule (or a rule mapping it to ``null``, to drop it), every one of our weights must be filled and
every shape must fit, else one line names the first key that does not. The rules are user input, so they are
matched by the ``regex`` package within ``MATCH_SECONDS`` in all: Python's ``re`` has no time limit and no check
for Ctrl-C while it backtracks, and a rule such as ``^(a|a)*$`` backtracks for ever on a long key.
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from collections.abc import Mapping

import regex
import torch

from vit.model import ViT, ViTConfig

UNKNOWN = "?"
PATCH_ORDERS = ("c p1 p2", "p1 p2 c")  # a linear patch embedding's input: channel-major (a conv's) or channel-last
THIRDS = ("q", "k", "v")  # a target's suffix naming a third of a fused qkv weight, in our stacking order
MAX_RULES = 1000
MAX_KEY_SHOWN = 100
MATCH_SECONDS = 10.0  # all of a mapping's matching: a ViT-g's 600 keys against 200 rules take well under 1 s
_INDEX = re.compile(r"(?<=\.)(\d+)(?=\.)")


def block_prefix(state: Mapping[str, torch.Tensor]) -> tuple[str | None, int]:
    """The key prefix of the numbered blocks (``transformer.layers``) and how many there are: the numbered
    segment that the most keys share, with indices 0..L-1."""
    counts: Counter = Counter()
    indices: dict[str, set[int]] = {}
    for key in state:
        for match in _INDEX.finditer(key):
            prefix = key[:match.start() - 1]
            counts[prefix] += 1
            indices.setdefault(prefix, set()).add(int(match.group(1)))
    for prefix, _ in counts.most_common():
        if indices[prefix] == set(range(len(indices[prefix]))):
            return prefix, len(indices[prefix])
    return None, 0


def model_width(state: Mapping[str, torch.Tensor], prefix: str | None) -> int | None:
    """The residual width: the most common length of the blocks' 1-D tensors (norms, output biases)."""
    lengths = Counter(v.shape[0] for k, v in state.items() if v.dim() == 1 and (prefix is None or k.startswith(prefix)))
    return lengths.most_common(1)[0][0] if lengths else None


def describe(state: Mapping[str, torch.Tensor]) -> str:
    """What a state dict looks like, in one line: 'a state dict of 52 tensors, a ViT with 6 blocks of width 256,
    keys like `transformer.layers.0.0.fn.to_qkv.weight`'."""
    prefix, blocks = block_prefix(state)
    keys = list(state)
    if prefix is None:
        return f"a state dict of {len(state):,} tensors without numbered blocks, keys like `{keys[0][:80]}`"
    first = [k for k in keys if k.startswith(f"{prefix}.0.")]
    example = next((k for k in first if re.search(r"qkv|query|in_proj|attn|attention", k)), first[0])[:MAX_KEY_SHOWN]
    width = model_width(state, prefix)
    return f"a state dict of {len(state):,} tensors, a ViT with {blocks} blocks of width {width}, keys like `{example}`"


# -- the draft ------------------------------------------------------------------------------------------------------

def _module(key: str) -> str:
    return key.rpartition(".")[0]


_ROLE = re.compile(r"^(?:to_|w_?)?(q|k|v|query|key|value)(?:_proj|_lin|_linear)?$")  # a separate q, k or v layer


def _role(module: str) -> str | None:
    """'q', 'k' or 'v' for a separate query, key or value layer (``attn.query``, ``to_k``, ``v_proj``), else None."""
    match = _ROLE.match(module.rpartition(".")[2].lower())
    return match.group(1)[0] if match else None


def _block_targets(state: Mapping[str, torch.Tensor], prefix: str, width: int) -> dict[str, str]:
    """Block 0's parameter suffixes -> our block parameter names, guessed from names and shapes ('?' when unsure).
    Separate q, k, v layers map to thirds of our fused qkv (``attn.qkv.weight:q``), which ``apply_mapping`` stacks."""
    first = {k[len(prefix) + 3:]: v for k, v in state.items() if k.startswith(f"{prefix}.0.")}
    fused = [v.shape[0] // 3 for k, v in first.items() if v.dim() == 2 and re.search(r"qkv|in_proj", k.lower())]
    single = [v.shape[0] for k, v in first.items() if v.dim() == 2 and _role(_module(k)) == "q"]
    inner = (fused or single or [width])[0]  # the attention's inner width, which its output projection reads
    modules: dict[str, str] = {}
    norms = 0
    for suffix, value in first.items():
        module, name = _module(suffix), suffix.rpartition(".")[2]
        if module in modules:
            continue
        if value.dim() == 2:
            rows, cols = value.shape
            lowered = suffix.lower()
            if _role(module) and cols == width:
                modules[module] = f"attn.qkv:{_role(module)}"
            elif cols == width and rows % 3 == 0 and re.search(r"qkv|in_proj", lowered + name):
                modules[module] = "attn.qkv"
            elif rows == width and cols == inner and re.search(r"attn|attention|out|proj|\bo\b", lowered):
                modules[module] = "attn.proj"
            elif cols == width and rows != width:
                modules[module] = "mlp.fc1"
            elif rows == width and cols != width:
                modules[module] = "mlp.fc2"
            else:
                modules[module] = UNKNOWN
        elif value.dim() == 1 and value.shape[0] == width and f"{module}.weight" in first \
                and first[f"{module}.weight"].dim() == 1:
            norms += 1
            modules[module] = {1: "norm1", 2: "norm2"}.get(norms, UNKNOWN)
    if "in_proj_weight" in "".join(first):  # nn.MultiheadAttention's parameters have no module of their own
        for suffix in first:
            if suffix.endswith(("in_proj_weight", "in_proj_bias")):
                modules[suffix] = "attn.qkv." + ("weight" if suffix.endswith("weight") else "bias")
    targets = {}
    for suffix in first:
        module, name = _module(suffix), suffix.rpartition(".")[2]
        if suffix in modules:
            targets[suffix] = modules[suffix]
        elif modules.get(module, UNKNOWN) == UNKNOWN or name not in ("weight", "bias"):
            targets[suffix] = UNKNOWN
        else:
            base, _, role = modules[module].partition(":")
            targets[suffix] = f"{base}.{name}" + (f":{role}" if role else "")
    return targets


def _top_targets(state: Mapping[str, torch.Tensor], prefix: str | None, width: int) -> dict[str, str]:
    """The keys outside the blocks -> ours: patch embedding, class token, positions, final norm, head."""
    top = {k: v for k, v in state.items() if prefix is None or not k.startswith(f"{prefix}.")}
    targets: dict[str, str] = {}
    modules: dict[str, str] = {}
    for key, value in top.items():
        module, name, lowered = _module(key), key.rpartition(".")[2], key.lower()
        if value.dim() == 4 and value.shape[0] == width:
            modules[module] = "patch_embed"
        elif value.dim() == 2 and value.shape[0] == width and "patch" in lowered:
            modules[module] = "patch_embed"
        elif "cls" in lowered or "class_token" in lowered:
            targets[key] = "cls_token"
        elif "pos" in lowered and value.shape[-1] == width and value.dim() >= 2:
            targets[key] = "pos_embed"
        elif value.dim() == 2 and value.shape[1] == width:
            modules[module] = "head"
        elif value.dim() == 1 and value.shape[0] == width and name == "weight" and f"{module}.bias" in top:
            modules[module] = "norm"
    for key in top:
        if key in targets:
            continue
        module, name = _module(key), key.rpartition(".")[2]
        targets[key] = f"{modules[module]}.{name}" if module in modules and name in ("weight", "bias") else UNKNOWN
    return targets


def draft_mapping(state: Mapping[str, torch.Tensor]) -> dict:
    """A mapping to check and complete (see the module docstring), read from names and shapes alone."""
    prefix, blocks = block_prefix(state)
    width = model_width(state, prefix) or 0
    top = _top_targets(state, prefix, width)
    block = _block_targets(state, prefix, width) if prefix is not None else {}
    rules = {f"^{re.escape(key)}$": target for key, target in top.items()}
    for suffix, target in block.items():
        rules[f"^{re.escape(prefix)}\\.(\\d+)\\.{re.escape(suffix)}$"] = \
            target if target == UNKNOWN else f"blocks.\\1.{target}"
    by_target = {t: state[k] for k, t in top.items()} | {t: state[f"{prefix}.0.{s}"] for s, t in block.items()}
    by_target |= {t.partition(":")[0]: v for t, v in by_target.items() if t.endswith(":q")}  # a third stands in
    # What the weights decide is stated; what they do not is "?" (no common default) or a default named in "guessed".
    config: dict = {"hidden_size": width, "num_layers": blocks, "num_heads": UNKNOWN, "layer_norm_eps": 1e-5,
                    "activation": "gelu", "post_norm": False}
    guessed = {"layer_norm_eps": "nn.LayerNorm's default; timm uses 1e-6, HF transformers 1e-12",
               "activation": "exact GELU; tanh-approximate is gelu_tanh, nn.TransformerEncoderLayer's default relu",
               "post_norm": "pre-norm blocks; true for nn.TransformerEncoderLayer's default (norm_first=False)",
               "preprocessing": "Normalize(0.5, 0.5): the images' mean and std during training"}
    draft: dict = {}
    patch = by_target.get("patch_embed.weight")
    if patch is not None and patch.dim() == 4:
        config.update(num_channels=patch.shape[1], patch_size=patch.shape[-1])
        if patch.shape[-2] != patch.shape[-1]:
            config["patch_size"] = UNKNOWN  # ours are square: a rectangular one cannot be mapped
    elif patch is not None:
        fits = [c for c in (1, 3) if math.isqrt(patch.shape[1] // c) ** 2 * c == patch.shape[1]]
        if fits:
            config.update(num_channels=fits[0], patch_size=math.isqrt(patch.shape[1] // fits[0]))
            guessed["patch_size"] = (f"square patches of {fits[0]} channels; the weights fix only channels x height x "
                                     f"width = {patch.shape[1]}")
        draft["patch_order"] = UNKNOWN  # 'c p1 p2' (a convolution's order) or 'p1 p2 c' (einops, unfold + permute)
    pos = by_target.get("pos_embed")
    if pos is not None and isinstance(config.get("patch_size"), int):
        tokens = pos.shape[-2] - int("cls_token" in by_target)
        if math.isqrt(tokens) ** 2 == tokens:
            config["image_size"] = math.isqrt(tokens) * config["patch_size"]
            guessed["image_size"] = f"a square grid; the position table fixes only the patch count, {tokens}"
    head = by_target.get("head.weight")
    config["num_classes"] = head.shape[0] if head is not None else 0
    qkv = by_target.get("attn.qkv.weight")
    if qkv is not None and qkv.shape[0] != (width if "attn.qkv.weight:q" in by_target else 3 * width):
        config["head_dim"] = UNKNOWN  # heads x head width is not the model's width
    if "mlp.fc1.weight" in by_target:
        config["mlp_size"] = by_target["mlp.fc1.weight"].shape[0]
    config["qkv_bias"] = "attn.qkv.bias" in by_target
    config["final_norm"] = "norm.weight" in by_target
    if "cls_token" not in by_target:
        config.update(class_token=False, pooling="avg")
    else:
        config["pooling"] = "cls"
        guessed["pooling"] = "the class token's output; avg if the model averages the patches"
    channels = config.get("num_channels", 3)
    return {"about": "Draft by vit.convert --inspect: check every entry and replace each '?' (num_heads: how many "
                     "heads the attention splits into; head_dim: the width of each; patch_order: 'c p1 p2' or "
                     "'p1 p2 c'); the weights do not decide the values named in \"guessed\": check them against "
                     "your model's code. Map a key to null to drop it; a target ending in :q, :k or :v is that third "
                     "of a fused weight (stacked q, k, v). Then: python -m vit.convert WEIGHTS --map THIS.json "
                     "--out model.pt",
            "config": config, "guessed": guessed, **draft, "keys": rules,
            "preprocessing": {"mean": [0.5] * channels, "std": [0.5] * channels}}


# -- applying a mapping ---------------------------------------------------------------------------------------------

def apply_mapping(state: Mapping[str, torch.Tensor], mapping: Mapping) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """Our config and state dict from ``state`` by ``mapping`` (``draft_mapping``'s form), strictly: ValueError
    with one line naming the first key without a rule, the first of our weights left empty, or a misfit shape."""
    values = mapping.get("config")
    if not isinstance(values, Mapping):
        raise ValueError("the mapping has no \"config\" object")
    unfilled = [name for name, value in values.items() if value == UNKNOWN]
    if unfilled:
        raise ValueError(f"the mapping's config still has '?' for {', '.join(unfilled)}: fill it in")
    config = ViTConfig.from_dict(dict(values))
    rules = mapping.get("keys")
    if not isinstance(rules, Mapping) or not rules or len(rules) > MAX_RULES:
        raise ValueError(f"the mapping needs a \"keys\" object of 1 to {MAX_RULES} rules")
    compiled = []
    for pattern, target in rules.items():
        if target is not None and not isinstance(target, str):
            raise ValueError(f"rule {pattern!r} maps to {target!r}, not a key name or null")
        try:
            compiled.append((regex.compile(pattern), target))
        except regex.error as e:
            raise ValueError(f"rule {pattern!r} is not a regular expression ({e})") from None
    order = mapping.get("patch_order", "c p1 p2")
    if order not in PATCH_ORDERS:
        raise ValueError(f"patch_order must be 'c p1 p2' or 'p1 p2 c', got {str(order)[:60]!r}")
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in ViT(config).state_dict().items()}
    ours: dict[str, torch.Tensor] = {}
    thirds: dict[str, dict[str, tuple[str, torch.Tensor]]] = {}  # fused weights given as separate q, k, v
    deadline = time.monotonic() + MATCH_SECONDS
    for key, value in state.items():
        rule = _first_match(compiled, key, deadline)
        if rule is None:
            raise ValueError(f"{key} is matched by no rule; add one to \"keys\" (or map it to null to drop it)")
        match, target = rule
        if target is None:
            continue
        try:
            name = match.expand(target)
        except (regex.error, IndexError) as e:
            raise ValueError(f"rule {match.re.pattern!r} cannot fill {target!r} from {key} ({e})") from None
        name, _, role = name.partition(":")
        if name == UNKNOWN or name not in expected or (role and (role not in THIRDS or ".qkv." not in name)):
            raise ValueError(f"{key} is mapped to {match.expand(target)!r}, which is not one of this "
                             f"model's weights (e.g. {', '.join(list(expected)[:4])}, ...; a qkv one may end in :q, "
                             ":k or :v)")
        if name in ours or role in thirds.get(name, {}) or (name in thirds and not role):
            raise ValueError(f"{key} is mapped to {name}{':' + role if role else ''}, which another key already fills")
        if role:
            thirds.setdefault(name, {})[role] = (key, value)
        else:
            ours[name] = _fit(key, value, name, expected[name], config, order)
    for name, parts in thirds.items():
        absent = [role for role in THIRDS if role not in parts]
        if absent:
            raise ValueError(f"no key is mapped to {name}:{absent[0]}, the {absent[0]} third of {name} (from "
                             f"{parts[next(iter(parts))][0]} and its siblings); add a rule for the key that holds it")
        stacked = torch.cat([parts[role][1] for role in THIRDS], dim=0)  # our qkv: all queries, keys, then values
        ours[name] = _fit(" + ".join(parts[role][0] for role in THIRDS), stacked, name, expected[name], config, order)
    missing = [k for k in expected if k not in ours]
    if missing:
        more = f" (nor to {len(missing) - 1} more)" if missing[1:] else ""
        raise ValueError(f"no key is mapped to {missing[0]}{more}; add a rule for the key that holds it")
    return config, ours


def _first_match(compiled: list, key: str, deadline: float) -> tuple[regex.Match, str | None] | None:
    """The first rule's match of all of ``key`` and its target, or None; ValueError once ``deadline`` passes."""
    for pattern, target in compiled:
        try:  # the timeout is what is left of the whole mapping's time, so no number of rules can add up to more
            match = pattern.fullmatch(key, timeout=max(deadline - time.monotonic(), 1e-3))
        except TimeoutError:
            raise ValueError(f"rule {pattern.pattern[:MAX_KEY_SHOWN]!r} was still matching {key[:MAX_KEY_SHOWN]} "
                             f"when the mapping's {MATCH_SECONDS:g} s ran out (a nested repeat such as (a|a)* or "
                             "(a+)+ backtracks for ever); simplify the rule") from None
        if match:
            return match, target
    return None


def _fit(key: str, value: torch.Tensor, name: str, shape: tuple, config: ViTConfig, order: str) -> torch.Tensor:
    """``value`` in the shape of our weight ``name``: as it is, a linear patch embedding as our convolution, or a
    token table with its batch axis added; ValueError naming both shapes otherwise."""
    if tuple(value.shape) == shape:
        return value
    if name == "patch_embed.weight" and value.dim() == 2 and value.numel() == math.prod(shape):
        d, c, p = shape[0], config.num_channels, config.patch_size
        return value.reshape(d, p, p, c).permute(0, 3, 1, 2) if order == "p1 p2 c" else value.reshape(shape)
    if name in ("cls_token", "pos_embed", "reg_token") and value.numel() == math.prod(shape):
        return value.reshape(shape)
    raise ValueError(f"{key} has shape {tuple(value.shape)}, which does not fit {name} {shape} of the mapping's config")
