"""One relevance map of a random ViT-B/16 at 224 px, timed in its own process: this checkout against another, and
LeGrad against its authors' code on the same weights (HF transformers' ViT, eager attention).

Run with ``PYTHONPATH`` set to each checkout, alternating the two several times (each run also timed as a whole
process: import, model, one warm-up and ``--repeats`` maps), and compare the printed medians (the map alone)::

    PYTHONPATH=../baseline python bench/bench_relevance.py --method legrad   # in turn with:
    PYTHONPATH=. python bench/bench_relevance.py --method legrad
    PYTHONPATH=. python bench/bench_relevance.py --method legrad-authors

Methods: ``legrad`` (the last two layers, the authors' default), ``lrp`` (Chefer et al.'s transformer
attribution), ``attnlrp``, ``cp-lrp``, and ``legrad-authors`` (WalBouss/LeGrad's ``compute_legrad`` as vendored in
tests/reference, on HF's ViT with the same random weights, reading the class logit as tests/test_relevance.py does),
``attnlrp-lxt`` (lxt's AttnLRP rules patched into HF's ViT of the same shapes, as tests/test_relevance.py does),
``lrp-chefer`` (Chefer et al.'s own ViT_LRP and ``generate_LRP``, vendored in tests/reference, on the same weights).

Measured 2026-11-23 on the 2-core machine under heavy load from other jobs, whole processes in turn (A B A B, 3 pairs;
2 for LRP), median CPU-seconds ratio after / before the hook points and rule context (and the printed map-only
medians): LeGrad 0.716 (map 2.9-4.0 s after, 4.4-11.5 s before), AttnLRP 0.827 (7.2-12.8 s after, 7.3-10.8 s before),
CP-LRP 0.748, Chefer's LRP 1.005 (its relevance propagation dominates); LeGrad against its authors' code 0.576 of
the CPU-seconds (whole process, theirs importing transformers) and map-only medians 3.1-5.7 s against 5.4-8.6 s.

2026-11-23, later, the map alone in the process's CPU seconds (the machine under a load of 10-25, so the wall
times are not comparable), one process each in turn, ``--repeats 3`` (lxt: 1): AttnLRP 4.90 and 6.53 CPU s against
lxt's rules on HF's ViT 8.52 (0.58-0.77 of its CPU time); LeGrad 1.76 against its authors' code 2.47 (0.71).

2026-11-23, evening, Chefer's LRP against its authors' code (``--threads 1 --repeats 3``, ``lrp`` and ``lrp-chefer``
in turn, two turns, the machine under a load of 4-8): 3.36 and 3.48 CPU s against 6.80 and 7.07 (0.49 and 0.49 of
its CPU time; map-only wall medians 9.1 and 11.6 s against 28.0 and 31.3 s).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from vit.model import ViT, ViTConfig


def ours(method: str, model: ViT):
    from vit.explain import relevance

    return {"legrad": lambda x, c: relevance.legrad(model, x, c),
            "lrp": lambda x, c: relevance.transformer_attribution(model, x, c),
            "attnlrp": lambda x, c: relevance.attnlrp(model, x, c),
            "cp-lrp": lambda x, c: relevance.attnlrp(model, x, c, cp=True)}[method]


def authors_legrad(model: ViT):
    """The authors' LeGrad on HF's ViT holding ``model``'s weights."""
    import transformers

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.reference.legrad.legrad_reference import compute_legrad

    c = model.config
    config = transformers.ViTConfig(image_size=c.image_size, patch_size=c.patch_size, hidden_size=c.hidden_size,
                                    num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
                                    intermediate_size=c.mlp_size, num_labels=c.num_classes, layer_norm_eps=1e-6)
    config._attn_implementation = "eager"
    hf = transformers.ViTForImageClassification(config).eval()  # random weights, the same shapes and cost

    def run(x, classes):
        with torch.enable_grad():
            out = hf(pixel_values=x, output_hidden_states=True, output_attentions=True)
            feats, attns = list(out.hidden_states[1:]), list(out.attentions)

            def score_of_feat(feat):
                return hf.classifier(hf.vit.layernorm(feat)[:, 0])[:, classes].T

            return compute_legrad(feats, attns, score_of_feat, num_prompts=1, patch_size=c.patch_size,
                                  starting_depth=c.num_layers - 2)

    return run


def authors_lrp(model: ViT):
    """Chefer et al.'s own LRP (hila-chefer/Transformer-Explainability's ViT_LRP, vendored in tests/reference) holding
    ``model``'s weights, its map generated as tests/test_relevance.py generates it (``generate_LRP``)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.test_relevance import chefer_reference, chefer_reference_map

    ref = chefer_reference(model)
    return lambda x, classes: chefer_reference_map(ref, x, int(classes[0]))


def authors_attnlrp(model: ViT):
    """lxt's AttnLRP (its ``efficient`` rules, vendored in tests/reference/lxt) patched into HF's ViT of ``model``'s
    shapes, as tests/test_relevance.py does: one forward and one backward of the class logit, input x gradient."""
    import transformers
    import transformers.models.vit.modeling_vit as modeling_vit
    from transformers.activations import GELUActivation

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.reference.lxt.patches import layer_norm_forward, non_linear_forward, wrap_attention_forward

    c = model.config
    config = transformers.ViTConfig(image_size=c.image_size, patch_size=c.patch_size, hidden_size=c.hidden_size,
                                    num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
                                    intermediate_size=c.mlp_size, num_labels=c.num_classes, layer_norm_eps=1e-6)
    config._attn_implementation = "eager"
    hf = transformers.ViTForImageClassification(config).eval()  # random weights: the cost does not depend on them
    torch.nn.LayerNorm.forward = layer_norm_forward  # this process only runs this map
    GELUActivation.original_forward = GELUActivation.forward
    GELUActivation.forward = non_linear_forward
    modeling_vit.eager_attention_forward = wrap_attention_forward(modeling_vit.eager_attention_forward)

    def run(x, classes):
        with torch.enable_grad():
            x = x.clone().requires_grad_(True)
            hf(pixel_values=x).logits[0, int(classes[0])].backward()
            return (x * x.grad).sum(1)

    return run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--method", default="legrad", choices=["legrad", "lrp", "attnlrp", "cp-lrp", "legrad-authors",
                                                          "attnlrp-lxt", "lrp-chefer"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--preset", default="vit-base-16")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = ViT(ViTConfig.from_preset(args.preset)).eval()
    c = model.config
    image = torch.randn(1, c.num_channels, c.image_size, c.image_size)
    authors = {"legrad-authors": authors_legrad, "attnlrp-lxt": authors_attnlrp, "lrp-chefer": authors_lrp}
    run = authors[args.method](model) if args.method in authors else ours(args.method, model)
    classes = torch.tensor([3])
    run(image, classes)  # warm-up
    times, cpu = [], []  # wall seconds, and the process's CPU seconds (what other jobs' load does not inflate)
    for _ in range(args.repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        run(image, classes)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    print(f"{args.method} {args.preset}: median {statistics.median(times):.3f} s, {statistics.median(cpu):.3f} CPU s "
          f"over {args.repeats}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
