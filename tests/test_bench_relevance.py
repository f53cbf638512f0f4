"""``bench/bench_relevance.py --against``: its agreement check compares each of our maps with its authors' map of the
same weights as the parity tests do, on a tiny model (the timings themselves are measured in bench/, not here)."""

import importlib.util
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_relevance.py"
TINY = ["--preset", "tintn-cifar10", "--size", "32", "--repeats", "1"]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_relevance", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def lxt_undone(monkeypatch):
    """attnlrp-lxt patches LayerNorm, HF's GELU and HF ViT's attention for the whole process: undone afterwards."""
    import transformers.models.vit.modeling_vit as modeling_vit
    from transformers.activations import GELUActivation

    monkeypatch.setattr(torch.nn.LayerNorm, "forward", torch.nn.LayerNorm.forward)
    monkeypatch.setattr(GELUActivation, "forward", GELUActivation.forward)
    monkeypatch.setattr(GELUActivation, "original_forward", None, raising=False)
    monkeypatch.setattr(modeling_vit, "eager_attention_forward", modeling_vit.eager_attention_forward)


@pytest.mark.parametrize("method, against", [("lrp", "lrp-chefer"), ("legrad", "legrad-authors"),
                                             ("attnlrp", "attnlrp-lxt")])
def test_each_method_agrees_with_its_authors_code_in_the_bench(bench, lxt_undone, capsys, method, against):
    assert bench.main(["--method", method, "--against", against, *TINY]) == 0
    assert f"{method} and {against} agree" in capsys.readouterr().out


def test_the_agreement_check_refuses_chefers_map_of_another_class(bench):
    hf, model = bench.build_pair("tintn-cifar10", 32)
    image = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    bench.agree("lrp", "lrp-chefer", hf, model, image, torch.tensor([3]))  # the same class: agrees
    ours = bench.build("lrp", hf, model)(image, torch.tensor([3]))
    theirs = bench.build("lrp-chefer", hf, model)(image, torch.tensor([5]))
    with pytest.raises(AssertionError, match="not close"):
        bench.check_agree("lrp", "lrp-chefer", ours, theirs, model.config.patch_size, (8, 8))  # 32 px / 4
