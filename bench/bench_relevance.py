"""One relevance map of a random ViT-B/16, ours against its authors' code on the same weights, or this checkout
against another.

Every side runs on one model's weights: HF transformers' ViT (eager attention) with random weights plus noise, and
ours converted from it (``vit.sources.ports.families.hf``). Run from the repository root (no ``PYTHONPATH``: the script
puts its checkout first on the path)::

    python bench/bench_relevance.py --method legrad --against legrad-authors --threads 1     # interleaved
    python bench/bench_relevance.py --method legrad --against legrad-authors --threads 1 --size 448
    python bench/bench_relevance.py --method legrad                                            # one side alone

``--against``: both maps in one process, their calls alternating (A B B A ...) so that other jobs' load slows both
alike; the two maps are first checked to agree on float64 copies of the models (``torch.testing.assert_close`` on
the patch grid, on the authors' map's scale; LeGrad's upsampled and min-max normalised as its authors return it,
Chefer's ``(B, T, T)`` relevance read at its CLS row as ``generate_LRP`` returns it), then the medians and the
ratio of the process's CPU seconds per map are printed with the load average. Without it: one method's map, timed
in its own process (import, model, one warm-up and ``--repeats`` maps), to compare whole processes or checkouts
(``--root`` another checkout).

Methods: ``legrad`` (the last two layers, the authors' default), ``lrp`` (Chefer et al.'s transformer
attribution), ``attnlrp``, ``cp-lrp``, and ``legrad-authors`` (WalBouss/LeGrad's ``compute_legrad`` as vendored in
tests/reference, on HF's ViT, reading the class logit as tests/test_relevance.py does), ``attnlrp-lxt`` (lxt's
AttnLRP rules patched into HF's ViT, as tests/test_relevance.py does), ``lrp-chefer`` (Chefer et al.'s own ViT_LRP
and ``generate_LRP``, vendored in tests/reference).

2026-11-24, LeGrad against its authors' code, ``--against legrad-authors --threads 1``, interleaved in one process,
median ratio of CPU seconds per map (load average 4.5-6.6), this checkout against the one before (the same bench
copied into it): at 224 px (``--repeats 7``) 0.852, 0.875 and 0.836 against 1.133 and 1.121 before; at 448 px
(``--size 448 --repeats 3``) 0.732 against 0.869. Before, LeGrad ran a fast forward keeping every block's input and
re-ran its last two blocks whole with their graph; it now keeps only the explained blocks' inputs, skips the last
block's full forward and re-runs the explained blocks for the classifier's readout token alone.

Earlier figures (2026-11-23, whole processes in turn, random weights differing between the sides): AttnLRP 4.90 and
6.53 CPU s against lxt's rules on HF's ViT 8.52 (0.58-0.77 of its CPU time, load 10-25); Chefer's LRP 3.36 and
3.48 CPU s against 6.80 and 7.07 (0.49, ``--threads 1``, load 4-8).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a clean checkout: python bench/bench_relevance.py
from vit.model import ViT, ViTConfig  # noqa: E402


def build_pair(preset: str, size: int, seed: int = 0) -> tuple[torch.nn.Module, ViT]:
    """HF's ViT (eager attention) at ``size`` px with random weights plus noise (so biases and norms are not at their
    init), and ours holding the same weights."""
    import transformers

    from vit.sources.ports.families.hf import hf_config_kwargs, state_dict_from_hf

    torch.manual_seed(seed)
    config = ViTConfig.from_preset(preset, image_size=size, layer_norm_eps=1e-12, drop_path=0.0)  # HF's eps
    hf_config = transformers.ViTConfig(**hf_config_kwargs(config))
    hf_config._attn_implementation = "eager"
    hf = transformers.ViTForImageClassification(hf_config).eval()
    with torch.no_grad():
        for param in hf.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    ours = ViT(config)
    ours.load_state_dict(state_dict_from_hf(hf.state_dict(), config.num_layers), strict=True)
    return hf, ours.eval()


def ours(method: str, hf: torch.nn.Module, model: ViT):
    from vit.explain.methods import relevance

    return {"legrad": lambda x, c: relevance.legrad(model, x, c),
            "lrp": lambda x, c: relevance.transformer_attribution(model, x, c),
            "attnlrp": lambda x, c: relevance.attnlrp(model, x, c),
            "cp-lrp": lambda x, c: relevance.attnlrp(model, x, c, cp=True)}[method]


def authors_legrad(hf: torch.nn.Module, model: ViT):
    """The authors' LeGrad on HF's ViT ``hf`` (the weights ``model`` holds): its ``(1, 1, H, W)`` map, upsampled
    and min-max normalised."""
    from tests.reference.legrad.legrad_reference import compute_legrad

    c = model.config

    def run(x, classes):
        with torch.enable_grad():
            out = hf(pixel_values=x, output_hidden_states=True, output_attentions=True)
            feats, attns = list(out.hidden_states[1:]), list(out.attentions)

            def score_of_feat(feat):
                return hf.classifier(hf.vit.layernorm(feat)[:, 0])[:, classes].T

            return compute_legrad(feats, attns, score_of_feat, num_prompts=1, patch_size=c.patch_size,
                                  starting_depth=c.num_layers - 2)

    return run


def authors_lrp(hf: torch.nn.Module, model: ViT):
    """Chefer et al.'s own LRP (hila-chefer/Transformer-Explainability's ViT_LRP, vendored in tests/reference) holding
    ``model``'s weights, its map generated as tests/test_relevance.py generates it (``generate_LRP``)."""
    from tests.test_relevance import chefer_reference, chefer_reference_map

    ref = chefer_reference(model).to(next(model.parameters()).dtype)  # its layers are built float32
    return lambda x, classes: chefer_reference_map(ref, x, int(classes[0]))


def authors_attnlrp(hf: torch.nn.Module, model: ViT):
    """lxt's AttnLRP (its ``efficient`` rules, vendored in tests/reference/lxt) patched into HF's ViT ``hf``, as
    tests/test_relevance.py does: one forward and one backward of the class logit, input x gradient. The patches
    change ``torch.nn.LayerNorm`` for the whole process: not for ``--against`` a method of ours."""
    import transformers.models.vit.modeling_vit as modeling_vit
    from transformers.activations import GELUActivation

    from tests.reference.lxt.patches import layer_norm_forward, non_linear_forward, wrap_attention_forward

    if torch.nn.LayerNorm.forward is not layer_norm_forward:  # once: a second wrap would call itself
        torch.nn.LayerNorm.forward = layer_norm_forward
        GELUActivation.original_forward = GELUActivation.forward
        GELUActivation.forward = non_linear_forward
        modeling_vit.eager_attention_forward = wrap_attention_forward(modeling_vit.eager_attention_forward)

    def run(x, classes):
        with torch.enable_grad():
            x = x.clone().requires_grad_(True)
            hf(pixel_values=x).logits[0, int(classes[0])].backward()
            return (x * x.grad).sum(1)

    return run


AUTHORS = {"legrad-authors": authors_legrad, "attnlrp-lxt": authors_attnlrp, "lrp-chefer": authors_lrp}


def build(method: str, hf: torch.nn.Module, model: ViT):
    return AUTHORS[method](hf, model) if method in AUTHORS else ours(method, hf, model)


def check_agree(method: str, against: str, a: torch.Tensor, b: torch.Tensor, patch_size: int,
                grid: tuple[int, int] | None = None, tolerance: float = 1e-4) -> None:
    """Both sides' maps of one image, compared as the parity tests compare them: on the patch grid ``grid``, divided
    by the second map's largest magnitude (relevances of random weights are ~1e-5), to ``tolerance``. Chefer's
    ``lrp`` returns the rolled-out ``(B, T, T)`` relevance and its authors' ``generate_LRP`` the CLS row without the
    CLS key, ``(B, gh*gw)``; LeGrad's is upsampled by the patch size and min-max normalised, as its authors return
    it. ``bench_gpu_maps`` compares float32 maps (1e-4); ``agree`` float64 ones (1e-6)."""
    from tests.reference.legrad.legrad_reference import min_max
    from vit.explain.methods.attention import token_map

    def shown(name: str, m: torch.Tensor) -> torch.Tensor:
        m = m.detach().float()
        if name == "legrad":
            return min_max(F.interpolate(m[None], scale_factor=patch_size, mode="bilinear"))
        if name == "lrp":
            m = token_map(m, 0, grid)  # (B, gh, gw): the CLS row, as token_map draws it
        elif name == "lrp-chefer":
            m = m.reshape(-1, *grid)  # (B, gh*gw) -> (B, gh, gw), row-major as the authors' reshape
        return m.reshape(1, 1, *m.shape[-2:])

    ours, theirs = shown(method, a), shown(against, b)
    scale = theirs.abs().max().clamp_min(torch.finfo(theirs.dtype).tiny)
    torch.testing.assert_close(ours / scale, theirs / scale, rtol=tolerance, atol=tolerance)


def agree(method: str, against: str, hf: torch.nn.Module, model: ViT, image: torch.Tensor,
          classes: torch.Tensor) -> None:
    """``check_agree`` on float64 copies of both models: Chefer's LRP divides by sums that nearly cancel on random
    weights, so in float32 two correct orders of its operations differ by 1e-2 of the map (float64: 1e-11)."""
    hf64, model64 = copy.deepcopy(hf).double(), copy.deepcopy(model).double()
    maps = [build(name, hf64, model64)(image.double(), classes) for name in (method, against)]
    config = model.config
    check_agree(method, against, *maps, config.patch_size, (config.image_size // config.patch_size,) * 2, 1e-6)


def timed(run, image: torch.Tensor, classes: torch.Tensor) -> tuple[float, float]:
    start, start_cpu = time.perf_counter(), time.process_time()
    run(image, classes)
    return time.perf_counter() - start, time.process_time() - start_cpu


def main(argv: list[str] | None = None) -> int:
    methods = ["legrad", "lrp", "attnlrp", "cp-lrp", *AUTHORS]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--method", default="legrad", choices=methods)
    p.add_argument("--against", choices=methods, help="a second method, interleaved with the first in this process")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--preset", default="vit-base-16")
    p.add_argument("--size", type=int, default=224, help="input side in px (the model is built at that size)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    hf, model = build_pair(args.preset, args.size)
    c = model.config
    image = torch.randn(1, c.num_channels, c.image_size, c.image_size)
    classes = torch.tensor([3])
    names = [args.method] + ([args.against] if args.against else [])
    if args.against:
        agree(args.method, args.against, hf, model, image, classes)
        print(f"{args.method} and {args.against} agree (float64, rtol 1e-6, atol 1e-6)")
    runs = {name: build(name, hf, model) for name in names}
    for run in runs.values():
        run(image, classes)  # the warm-up
    times = {name: [] for name in names}  # (wall, CPU seconds) per call: CPU is what other jobs' load inflates least
    for i in range(args.repeats):
        for name in names if i % 2 == 0 else names[::-1]:
            times[name].append(timed(runs[name], image, classes))
    for name in names:
        wall, cpu = (statistics.median(t[k] for t in times[name]) for k in (0, 1))
        print(f"{name} {args.preset} at {args.size} px, {args.threads} thread(s): median {wall:.3f} s, "
              f"{cpu:.3f} CPU s over {args.repeats}")
    if args.against:
        ratio = [a[1] / b[1] for a, b in zip(times[args.method], times[args.against], strict=True)]
        wall = [a[0] / b[0] for a, b in zip(times[args.method], times[args.against], strict=True)]
        print(f"{args.method} / {args.against}: CPU {statistics.median(ratio):.3f} (range {min(ratio):.3f}-"
              f"{max(ratio):.3f}), wall {statistics.median(wall):.3f}; load average "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
