"""A VLM folder whose processor and tower disagree (issue 113's review): refused in one line, never transformers'
raw error from inside ``generate``. GLM-OCR (a type no layout here names) built tiny by transformers with its own
processor (``test_vlm_any.build``) and saved whole, then its processor's settings edited: a ``temporal_patch_size``
other than its tower's (the frames a patch spans mean the same for every type) is refused from the declared sizes
before anything is built; a patch or merge size the declared sizes cannot judge on such a type (Aya Vision's
``patch_size`` is its tower's patch times its merge) reaches the model, whose own error (transformers' RuntimeError
from its forward) becomes one line. An error of ours inside that forward passes unchanged."""

import json
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")
from test_vlm_answer import QUESTION, noisy, picture  # noqa: E402
from test_vlm_any import build  # noqa: E402

import vit  # noqa: E402
from vit.explain.language.vlm_inputs import library_errors  # noqa: E402
from vit.registry import VLM_ARCHITECTURES  # noqa: E402
from vit.sources.vlm.whole_vlm import VLMError  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds


@pytest.fixture(scope="module")
def glm_ocr(tmp_path_factory):
    folder = tmp_path_factory.mktemp("glm_ocr")
    torch.manual_seed(0)
    model, processor = build("glm_ocr")
    noisy(model).save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def edited(base, tmp_path, **settings):
    """A copy of ``base`` whose image processor's ``settings`` are changed (its resize bounded to a few tokens)."""
    folder = tmp_path / "edited"
    shutil.copytree(base, folder)
    saved = json.loads((folder / "processor_config.json").read_text())
    saved["image_processor"].update(settings, size={"shortest_edge": 56 * 56, "longest_edge": 112 * 112})
    (folder / "processor_config.json").write_text(json.dumps(saved))
    return folder


def test_the_type_is_none_the_project_names(glm_ocr):
    assert json.loads((glm_ocr / "config.json").read_text())["model_type"] not in VLM_ARCHITECTURES


def test_a_temporal_patch_other_than_the_towers_is_refused_before_anything_is_built(glm_ocr, tmp_path):
    folder = edited(glm_ocr, tmp_path, temporal_patch_size=1)
    with pytest.raises(VLMError, match="sets image_processor.temporal_patch_size = 1 but its vision tower's "
                                       "temporal_patch_size is 2") as refusal:
        vit.open_vlm(folder)
    assert "\n" not in str(refusal.value)


@pytest.mark.parametrize("setting", [dict(merge_size=1), dict(patch_size=7)])
def test_a_patch_or_merge_the_model_cannot_read_is_refused_in_one_line(glm_ocr, tmp_path, setting):
    vlm = vit.open_vlm(edited(glm_ocr, tmp_path, **setting))
    with pytest.raises(ValueError, match="GlmOcrForConditionalGeneration failed on what the folder's processor gave "
                                         "it .*disagree with the model's config") as refusal:
        vit.ask_vlm(vlm, picture(), QUESTION, max_new_tokens=1)
    assert "\n" not in str(refusal.value)
    assert isinstance(refusal.value.__cause__, RuntimeError)  # transformers' own, kept as the cause


def test_an_error_of_ours_passes_unchanged():
    with pytest.raises(RuntimeError, match="^ours$"), library_errors(torch.nn.Identity()):
        raise RuntimeError("ours")
