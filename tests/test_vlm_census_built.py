"""Types the VLM census's builder could not build before its general rules (``bench/census_vlm_rules.py``, issue
113 item 2), built tiny by transformers with their own processors and saved whole, answer through the road: Qwen4-Exp
(a mixture-of-experts stack with no dense MLP width: ``intermediate_size`` absent, its experts' read for the declared
parameters' bound), DeepSeek-OCR 2 (a vision config of two towers, SAM then an encoder, and no sizes of its own:
counted from its parts) and Perception LM (a timm tower whose sizes only its ``model_args`` state). Each answers
with transformers' greedy ``generate``'s tokens, each answer token's attention at every layer equal to the eager row;
Qwen4-Exp's image tokens placed row-major over the 2 x 2 merge units of the grid its processor's ``image_grid_thw``
states (a transposed placement fails). The builder's rules themselves are checked on transformers' own config
classes: each shrunk config builds the model on the meta device."""

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
from test_vlm_answer import by_hand, eager_image_rows  # noqa: E402
from vlm_saved import assert_answer_is_generates, assert_image_rows_are_eager, census_answers  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds

KINDS = ("qwen4_exp", "deepseek_ocr2", "perception_lm")


@pytest.fixture(scope="module")
def answers(tmp_path_factory):
    return census_answers(tmp_path_factory, KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_the_answer_is_generates_greedy_answer(answers, kind):
    assert_answer_is_generates(*answers[kind][:3])


@pytest.mark.parametrize("kind", KINDS)
def test_each_tokens_attention_at_every_layer_is_the_eager_row(answers, kind):
    # float32 rows of noisy random weights over ~260 keys: one of DeepSeek-OCR 2's 1,028 differs by 1.2e-5
    assert_image_rows_are_eager(*answers[kind], atol=3e-5)


def test_qwen4_exp_tokens_are_placed_row_major_over_the_processors_grid(answers):
    answer, out, inputs, _ = answers["qwen4_exp"]
    grid, unit = tuple(inputs["image_grid_thw"][0, 1:].tolist()), 2  # Qwen3-VL's processor merges 2 x 2
    assert grid[0] != grid[1] and answer.layout.grid == grid and answer.layout.unit == unit
    row = eager_image_rows(out, 0, 0, answer.layout.positions).mean(0)  # its one attention layer of two
    ours = answer.attention(0, layer=0)
    np.testing.assert_allclose(ours, by_hand(row, grid, unit, 0), rtol=0, atol=1e-5)
    (gh, gw), u = grid, unit
    assert np.abs(ours - row.reshape(gw // u, gh // u).T.repeat(u, 0).repeat(u, 1)).max() > 1e-3


def test_an_infinity_transformers_config_class_defaults_to_is_no_size_but_others_are_refused():
    """Nemotron-H's ``time_step_limit`` (0.0, inf), which transformers writes as ``{"__float__": "Infinity"}``:
    decoded as transformers decodes it and accepted where its config class holds that default; an infinity
    elsewhere still refused in one line."""
    from vit.sources.vlm.declared import _finite_problem, special_floats

    saved = transformers.NemotronHConfig(num_hidden_layers=2).to_json_string()  # transformers' own writing
    import json

    config_json = special_floats({"model_type": "nemotron_h_omni", "text_config": json.loads(saved)})
    assert config_json["text_config"]["time_step_limit"] == [0.0, float("inf")]
    assert _finite_problem(config_json, "config.json") is None
    config_json["text_config"]["rms_norm_eps"] = float("inf")
    assert _finite_problem(config_json, "config.json") == ("its config.json sets text_config.rms_norm_eps = inf, "
                                                            "which is no size; give a finite number")


def test_nemotron_hs_mamba_shrunk_is_a_config_its_own_class_takes_and_narrow():
    """The builder's Mamba widths on transformers' own NemotronHConfig: its mixer's width (heads x head width) twice
    the tiny hidden size, its groups dividing its heads, its shared expert as narrow as an MLP."""
    import bench.census_vlm as census

    config = transformers.NemotronHConfig.from_dict(census._shrunk(transformers.NemotronHConfig().to_dict()))
    mlp = 2 * census.SIZES["hidden_size"]
    assert config.mamba_num_heads * config.mamba_head_dim == mlp and config.mamba_num_heads % config.n_groups == 0
    assert (config.ssm_state_size, config.chunk_size, config.moe_shared_expert_intermediate_size) == (16, 16, mlp)


# The types whose default config or processor the builder's rules make build: each shrunk config builds the model
# (transformers' own constructor on the meta device), its processor the class its kin names
RULED = {"cohere_compass": "CohereCompassProcessor", "cosmos3_omni": "Qwen3VLProcessor",
         "glmga": "Glm46VProcessor", "vision-encoder-decoder": "TrOCRProcessor", "deepseek_ocr2": None,
         "diffusion_gemma": None, "dots3_note": None, "ernie4_5_vl_moe": None, "inkling_mm_model": None,
         "nemotron_h_omni": None, "pi0": None, "qwen4_exp": None, "granite4_vision": None, "mistral4": None,
         "perception_lm": None,
         # issue 113's h16 rules: a vision_-named patch and an unguarded sliding mask's window (Step 3.7), expert
         # groups (Kimi K2.5), a patch from query counts (Aria), a timm tower's entry point shrunk (FastVLM), a
         # placeholder written out (PP-Chart2Table: its own processor, no kin's)
         "step3p7": None, "kimi_k25": None, "aria": None, "fast_vlm": "LlavaProcessor", "pp_chart2table": None}


@pytest.mark.parametrize("kind", sorted(RULED))
def test_the_census_builder_builds_the_type_with_its_processor(kind, monkeypatch):
    import bench.census_vlm as census

    built = {}

    def on_meta(model_class, config):  # the builder's own meta-device count, kept; the real build skipped
        census_bounded(model_class, config)
        with torch.device("meta"):
            built["model"] = model_class(config)
        raise StopIteration

    census_bounded = census._bounded
    monkeypatch.setattr(census, "_bounded", on_meta)
    try:
        census.generic_build(kind)
    except StopIteration:
        pass
    if kind == "mistral4":  # a language model alone: built with its tokenizer, no image to process
        model, processor = census.generic_build(kind)
        assert isinstance(processor, transformers.PreTrainedTokenizerBase)
        return
    assert sum(p.numel() for p in built["model"].parameters()) < census.MAX_PARAMETERS
    if RULED[kind]:
        assert census.processor_class_of(kind).__name__ == RULED[kind]
