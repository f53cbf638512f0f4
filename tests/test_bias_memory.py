"""The explorer's memory estimate holds for a model that adds a relative position bias to its attention logits: BEiT's
bias is ``(heads, T, T)`` whole (12.9 GB at 16,384 tokens and 12 heads), so a forward forms it one query chunk at a
time, the shared table too, and an estimate that left the chunk out would be under the peak.

Counted, not timed: the bytes of every CPU tensor torch's operators return, live at once (a dispatch mode that adds a
tensor's storage when an operator returns it and subtracts it when its last tensor is freed). A tiny random HF BEiT
(12 heads of width 2) on a 48 x 48 grid: 2,305 tokens, a whole bias of 243 MB against a 64 MB chunk.
"""

import weakref

import pytest
import torch
from PIL import Image
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from vit.costs import fits
from vit.costs.bounds import TooManyTokens
from vit.explain.methods.hidden import layer_pattern
from vit.explain.views import image_analysis
from vit.sources.open import open_source

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # importing transformers takes seconds

SIDE, PATCH, HEADS = 96, 2, 12
TOKENS = 1 + (SIDE // PATCH) ** 2


class LiveBytes(TorchDispatchMode):
    """The most bytes of CPU tensor storage that operators run under it held at once (``peak``)."""

    def __init__(self) -> None:
        super().__init__()
        self.tensors: dict[tuple[int, int], int] = {}  # storage -> how many live tensors returned on it
        self.now = self.peak = 0

    def _free(self, key: tuple[int, int]) -> None:
        self.tensors[key] -= 1
        if not self.tensors[key]:
            del self.tensors[key]
            self.now -= key[1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                storage = t.untyped_storage()
                key = (storage.data_ptr(), storage.nbytes())
                if key not in self.tensors:
                    self.tensors[key] = 0
                    self.now += key[1]
                    self.peak = max(self.peak, self.now)
                self.tensors[key] += 1
                weakref.finalize(t, self._free, key)
        return out


@pytest.fixture(scope="module", params=["shared", "per layer"])
def beit(request, tmp_path_factory):
    shared = request.param == "shared"
    config = transformers.BeitConfig(image_size=SIDE, patch_size=PATCH, hidden_size=2 * HEADS, intermediate_size=32,
                                     num_hidden_layers=2, num_attention_heads=HEADS, use_mean_pooling=True,
                                     use_relative_position_bias=not shared, use_shared_relative_position_bias=shared)
    folder = tmp_path_factory.mktemp("beit")
    torch.manual_seed(0)
    transformers.BeitModel(config).save_pretrained(folder)
    return open_source(folder)


def test_an_analysis_of_a_beit_stays_within_the_explorers_estimate(beit):
    config = beit.model.config
    assert config.rel_pos in ("beit", "beit_shared") and fits.has_logit_bias(config)
    estimate = fits.analysis_memory(config.num_layers, HEADS, config.hidden_size, TOKENS, cache_bytes=0,
                                    logit_bias=True)  # the layer cache is bounded on its own
    assert HEADS * TOKENS ** 2 * 4 > estimate  # the whole bias alone would be over it
    with LiveBytes() as memory:
        analysis = image_analysis.analyse(beit, Image.new("RGB", (SIDE, SIDE)))
        analysis.attentions.rows(TOKENS // 2)  # a query's row in every layer, from its bias rows
    assert memory.peak <= estimate
    without_bias = fits.analysis_memory(config.num_layers, HEADS, config.hidden_size, TOKENS, cache_bytes=0)
    assert memory.peak > without_bias  # the bias chunk is counted because it is formed


def test_reading_a_whole_layer_of_a_beit_forms_its_bias_by_chunks(beit):
    """The pattern read whole (the explicit path: a .npz, flow) holds the scores and the probabilities, never a
    third ``heads x T²`` for the bias."""
    hidden = torch.randn(1, TOKENS, beit.model.config.hidden_size)
    with torch.inference_mode(), LiveBytes() as memory:
        probs = layer_pattern(beit.model, 1, hidden, (SIDE // PATCH,) * 2)
    assert probs.shape == (1, HEADS, TOKENS, TOKENS)
    whole = HEADS * TOKENS ** 2 * 4
    assert memory.peak <= 2 * whole + fits.bias_chunk_bytes(HEADS, TOKENS) + 2**20


def test_the_dense_views_of_a_beit_stay_within_their_estimate(beit):
    """The PCA and similarity views' bound (``check_dense_fits``) counts the bias chunk a BEiT's forward forms."""
    import vit
    from vit.explain.views import dense_views

    with LiveBytes() as memory:
        vit.pca(beit, Image.new("RGB", (SIDE, SIDE)))
    assert memory.peak <= dense_views.dense_bytes(beit, TOKENS) - fits.LAYER_CACHE_BYTES  # the cache is bounded alone


def test_the_largest_dense_view_a_beit_is_told_it_can_have_fits(beit, monkeypatch):
    from vit.core.inference import InputSize
    from vit.explain.views import dense_views

    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "480")  # the fixed 384 MB (cache, chunk) and the bias chunk's 68
    image = Image.new("RGB", (SIDE, SIDE))
    with pytest.raises(TooManyTokens) as refused:
        dense_views.check_dense_fits(beit, image, InputSize(1024))
    side = int(str(refused.value).split("largest square input that fits is ")[1].split(" px")[0])
    dense_views.check_dense_fits(beit, image, InputSize(side))  # that size fits
