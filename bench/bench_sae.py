"""SAE training steps and harvesting, each against its baseline, as whole processes side by side.

``--what step``: ``STEPS`` training steps of ``vit.features.sae.SparseAutoencoder`` (our step: encode, decode, MSE,
AuxK with some latents dead, backward, the parallel-gradient removal, Adam, decoder renormalisation) or, with
``--reference``, the same steps through SAELens's own functions (``tests/reference/sae_lens``: its encode, decode
and ``calculate_topk_aux_loss``, Adam, no decoder constraint: SAELens's TopK relies on
``rescale_acts_by_decoder_norm`` instead). Time the pair with any process timer, e.g.::

    python bench/bench_sae.py --what step & python bench/bench_sae.py --what step --reference   # alternate, repeat

``--what harvest``: the activations after block ``--layer`` of the shipped cifar-s for ``--images`` random images
(the forward stopped at the hook point), or with ``--plain`` the model's plain inference on the same images: the
issue asks harvesting to run at >= 90 % of plain inference throughput.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def step_bench(args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    d_in, d_sae, k = args.d_in, args.d_in * args.expansion, args.k
    x_all = torch.randn(args.steps, args.batch, d_in)
    dead = torch.zeros(d_sae, dtype=torch.bool)
    dead[: d_sae // 10] = True
    if args.reference:
        from tests.reference.sae_lens.topk_reference import ReferenceTopKSAE

        sae = ReferenceTopKSAE(d_in, d_sae, k, aux_loss_coefficient=1 / 32)
        optimizer = torch.optim.Adam(sae.parameters(), lr=1e-3)
        for x in x_all:
            sae_in = sae.process_sae_in(x)
            hidden_pre = sae_in @ sae.W_enc + sae.b_enc
            feature_acts = sae.activation_fn(hidden_pre)
            sae_out = sae.decode(feature_acts)
            loss = (sae_out - x).pow(2).sum(dim=-1).mean() + sae.calculate_topk_aux_loss(x, sae_out, hidden_pre, dead)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    else:
        from vit.features.sae import SparseAutoencoder

        sae = SparseAutoencoder(d_in, d_sae, k)
        optimizer = torch.optim.Adam(sae.parameters(), lr=1e-3)
        for x in x_all:
            pre = sae.pre_activations(x)
            x_hat = sae.decode(sae.activate(pre))
            loss = (x_hat - x).pow(2).sum(dim=-1).mean() + sae.aux_k_loss(x, x_hat, pre, dead, 1 / 32)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            sae.remove_parallel_gradient()
            optimizer.step()
            sae.normalize_decoder()


def harvest_bench(args: argparse.Namespace) -> None:
    from vit.checkpoint import load_checkpoint
    from vit.features.harvest import layer_tokens
    from vit.features.sae import resid_hook_name

    model = load_checkpoint(ROOT / "checkpoints" / "cifar10-cifar-s.pt").model.eval()
    torch.manual_seed(0)
    images = torch.randn(args.images, 3, 32, 32)
    started = time.perf_counter()
    with torch.inference_mode():
        for batch in images.split(64):
            if args.plain:
                model(batch)
            else:
                layer_tokens(model, batch, resid_hook_name(args.layer))
    print(f"{'plain inference' if args.plain else 'harvest'}: {args.images / (time.perf_counter() - started):.0f} "
          "images/s", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--what", choices=("step", "harvest"), required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reference", action="store_true", help="step: SAELens's functions instead of ours")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--d-in", type=int, default=96)
    p.add_argument("--expansion", type=int, default=8)
    p.add_argument("--k", type=int, default=16)
    p.add_argument("--plain", action="store_true", help="harvest: the model's plain inference instead")
    p.add_argument("--images", type=int, default=2048)
    p.add_argument("--layer", type=int, default=4)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    (step_bench if args.what == "step" else harvest_bench)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
