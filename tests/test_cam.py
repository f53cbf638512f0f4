"""The CAM family (``vit.explain.methods.cam``) equals pytorch-grad-cam's own classes on timm's models of four families:
a ViT (CLS), DINOv2 with four registers, NaFlex (its 6 x 3 grid, four prefix tokens) and a Swin stage (no prefix,
after a merge). The reference hooks timm's ``norm1`` of the explained block (the ViT tutorial's
``model.blocks[-1].norm1``, the Swin tutorial's ``model.layers[-1].blocks[-1].norm1``) with the tutorial's
``reshape_transform`` written for each grid; its output, the min-max scaled ReLU of the CAM, is compared on the
token grid (``get_target_width_height`` returns None: no cv2 resize) to 1e-5, both models in float64 (in float32
the two networks' own rounding alone moves a DINOv2 map by 1.1e-5).

Reference: jacobgil/pytorch-grad-cam @ 084273b, pytorch_grad_cam/*_cam.py and base_cam.py
(tests/reference/pytorch_grad_cam).
"""

import numpy as np
import pytest
import torch
from parity_helpers import randomize
from PIL import Image

import vit
from tests.reference.pytorch_grad_cam.eigen_cam import EigenCAM
from tests.reference.pytorch_grad_cam.grad_cam import GradCAM
from tests.reference.pytorch_grad_cam.grad_cam_plusplus import GradCAMPlusPlus
from tests.reference.pytorch_grad_cam.image import scale_cam_image
from tests.reference.pytorch_grad_cam.layer_cam import LayerCAM
from tests.reference.pytorch_grad_cam.model_targets import ClassifierOutputTarget
from tests.reference.pytorch_grad_cam.score_cam import ScoreCAM
from tests.reference.pytorch_grad_cam.xgrad_cam import XGradCAM
from vit.core.inference import preprocess
from vit.explain.methods.cam import CAM_METHODS, cam
from vit.explain.views import attention_maps
from vit.sources.open import open_source

timm = pytest.importorskip("timm")
pytestmark = pytest.mark.slow  # importing timm takes seconds

REFERENCE = {"gradcam": GradCAM, "gradcam++": GradCAMPlusPlus, "xgradcam": XGradCAM, "eigencam": EigenCAM,
             "layercam": LayerCAM, "scorecam": ScoreCAM}
FAMILIES = {  # name, patch, extra model args, input (height, width)
    "vit": ("vit_base_patch16_224", 8, dict(dynamic_img_size=True), (48, 24)),
    "dinov2-reg4": ("vit_small_patch14_reg4_dinov2", 7, dict(dynamic_img_size=True), (42, 21)),
    "naflex": ("naflexvit_base_patch16_gap", 8, {}, (48, 24)),
}


def scaled(cam: torch.Tensor) -> torch.Tensor:
    """Our map as pytorch-grad-cam's ``forward`` scales its one layer's: ``scale_cam_image`` per layer, then again
    after ``aggregate_multi_layers`` (the second pass takes off the first's 1e-7, 6e-5 of a small map's range)."""
    return torch.from_numpy(scale_cam_image(scale_cam_image(cam.numpy())))


def reference_cam(method: str, model, target_layer, reshape_transform, images, index: int) -> torch.Tensor:
    reference = REFERENCE[method](model=model, target_layers=[target_layer], reshape_transform=reshape_transform)
    reference.get_target_width_height = lambda input_tensor: None  # the map on the token grid: no cv2 resize
    with reference:
        return torch.from_numpy(reference(images, [ClassifierOutputTarget(index)] * images.shape[0]))


def vit_transform(prefix: int, grid: tuple[int, int]):
    """The ViT tutorial's ``reshape_transform`` (``tensor[:, 1:]`` to 14 x 14) for ``prefix`` tokens and ``grid``."""
    def reshape_transform(tensor):
        result = tensor[:, prefix:, :].reshape(tensor.size(0), grid[0], grid[1], tensor.size(2))
        return result.transpose(2, 3).transpose(1, 2)
    return reshape_transform


def swin_transform(tensor):
    """The Swin tutorial's ``reshape_transform`` for timm 1.0's norm1, which keeps (B, H, W, C)."""
    return tensor.permute(0, 3, 1, 2)


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    built = {}
    for family, (name, patch, kwargs, size) in FAMILIES.items():
        torch.manual_seed(0)
        model = randomize(timm.create_model(name, pretrained=False, img_size=4 * patch, patch_size=patch,
                                            embed_dim=32, depth=2, num_heads=2, num_classes=3, **kwargs))
        folder = tmp_path_factory.mktemp(family) / "timm"
        timm.models.save_for_hf(model, folder, model_args=dict(num_heads=2, img_size=4 * patch, **kwargs),
                                safe_serialization=True)
        built[family] = model.double(), open_source(folder).model.double(), size, patch, folder
    return built


@pytest.fixture(scope="module")
def swin(tmp_path_factory):
    torch.manual_seed(0)
    model = randomize(timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, img_size=32, num_classes=3,
                                        embed_dim=24, depths=(2, 2), num_heads=(2, 4), window_size=4))
    folder = tmp_path_factory.mktemp("swin") / "timm"
    timm.models.save_for_hf(model, folder, model_args=dict(img_size=32, window_size=4), safe_serialization=True)
    return model.double(), open_source(folder).model.double(), folder


@pytest.mark.parametrize("method", list(CAM_METHODS))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_cam_of_the_last_blocks_norm1_equals_pytorch_grad_cam(families, family, method):
    reference, ours, (height, width), patch, _ = families[family]
    images = torch.randn(2, 3, height, width, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    grid = (height // patch, width // patch)
    expected = reference_cam(method, reference, reference.blocks[-1].norm1,
                             vit_transform(ours.num_prefix_tokens, grid), images, 1)
    mine = cam(ours, images, method, class_index=1)
    assert mine.shape == (2, *grid)
    torch.testing.assert_close(scaled(mine), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("method", list(CAM_METHODS))
@pytest.mark.parametrize("stage", [0, 1])
def test_cam_of_a_swin_stage_equals_pytorch_grad_cam(swin, stage, method):
    reference, ours, _ = swin
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    layer = [1, 3][stage]  # the stage's last block: 8 x 8 in stage 0, 4 x 4 after the merge
    expected = reference_cam(method, reference, reference.layers[stage].blocks[-1].norm1, swin_transform, images, 2)
    mine = cam(ours, images, method, class_index=2, layer=layer)
    assert mine.shape == (2, 8 // 2 ** stage, 8 // 2 ** stage)
    torch.testing.assert_close(scaled(mine), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("layer", [0, 1])
@pytest.mark.parametrize("method", ["gradcam", "eigencam"])
def test_vit_explain_draws_pytorch_grad_cams_map_of_the_chosen_class_and_block(families, method, layer):
    """The CAM starts from the block's input its analysis kept (issue 83): the first block's, the last's."""
    reference, _, _, patch, folder = families["dinov2-reg4"]
    checkpoint = vit.load(folder, device="cpu")  # float32: 1e-4 (a wrong block or class is off by far more)
    assert set(CAM_METHODS) <= set(vit.methods(checkpoint)) and set(CAM_METHODS) <= set(attention_maps.MAP_KINDS)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (30, 40, 3), dtype=np.uint8))
    target = {"target": 2} if method != "eigencam" else {}
    e = vit.explain(checkpoint, image, method, layer=layer, **target)
    x = preprocess([image], checkpoint.preprocessing).double()
    grid = (x.shape[2] // patch, x.shape[3] // patch)
    expected = reference_cam(method, reference, reference.blocks[layer].norm1, vit_transform(5, grid), x, 2)
    np.testing.assert_allclose(scaled(torch.from_numpy(e.map)[None].double()).numpy(), expected.numpy(), atol=1e-4)


@pytest.mark.parametrize("method", ["gradcam", "eigencam"])
def test_vit_explain_draws_pytorch_grad_cams_map_of_a_swin_stage(swin, method):
    """A Swin's analysis keeps each block's output: the CAM of block 3 (after the merge) starts from block 2's."""
    reference, _, folder = swin
    checkpoint = vit.load(folder, device="cpu")
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8))
    e = vit.explain(checkpoint, image, method, layer=3, **({"target": 2} if method != "eigencam" else {}))
    x = preprocess([image], checkpoint.preprocessing).double()
    expected = reference_cam(method, reference, reference.layers[1].blocks[-1].norm1, swin_transform, x, 2)
    np.testing.assert_allclose(scaled(torch.from_numpy(e.map)[None].double()).numpy(), expected.numpy(), atol=1e-4)


@pytest.mark.parametrize("method", ["gradcam", "eigencam"])
def test_the_blocks_before_the_explained_layer_keep_no_graph(method):
    """The gradient stops at the explained layer's first norm, so the blocks before it run without autograd: what
    autograd saves for the backward grows with the layers explained, not with the model's depth (a forward under
    grad kept every block's graph, their parameters needing gradients: 976 MB for a VideoMAE-B clip's Grad-CAM)."""
    from vit.model import ViT, ViTConfig

    torch.manual_seed(0)
    model = ViT(ViTConfig(image_size=32, patch_size=4, num_channels=3, num_classes=3, hidden_size=32, num_layers=6,
                          num_heads=2, mlp_size=64)).eval()
    images = torch.randn(1, 3, 32, 32)

    def saved(run) -> int:
        total = [0]

        def pack(t):
            total[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            run()
        return total[0]

    last = saved(lambda: cam(model, images, method, layer=-1))
    first = saved(lambda: cam(model, images, method, layer=0))
    if method == "eigencam":  # gradient-free: nothing saved at all
        assert last == first == 0
    else:
        assert 0 < last and 5 * last < first * 1.5, (last, first)  # one block's graph against six
        # Chefer's GradCAM on the last attention: its gradient stops at the last block too
        from vit.explain.methods.cam import attention_gradcam

        assert 0 < saved(lambda: attention_gradcam(model, images)) < first / 3
