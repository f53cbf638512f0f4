"""The VLM census builder's general rules (``bench/census_vlm_rules.py``) on hand-written inputs, checked against
values computed by hand; the rules on transformers' own config classes: ``tests/test_vlm_census_built.py``."""

from types import SimpleNamespace

from bench.census_vlm_rules import STATED, _kinds, pinpoint_side, processor_from_config, sections, stated_fields


def test_sections_sum_to_the_half_width_and_keep_equal_ones_equal():
    # Qwen2-VL's [16, 24, 24] over a 4-wide half: floors [1, 1, 1], the remainder on the lone 16
    assert sections([16, 24, 24], 4) == [2, 1, 1]
    # Ernie 4.5 VL's [22, 22, 20]: its height and width sections stacked pairwise stay equal
    assert sections([22, 22, 20], 4) == [1, 1, 2]
    assert sections([16, 24, 24], 8) == [2, 3, 3] and sum(sections([24, 20, 20], 16)) == 16


def test_the_kinds_a_per_layer_list_takes_are_read_from_the_config_docstring():
    class Config:
        """
        mlp_layer_types (`list[str]`, *optional*):
            MLP type (`"dense"` or `"sparse"`) for each decoder layer, e.g. `["dense", "sparse", ...]`.
        topk_method (`str`, *optional*, defaults to `"greedy"`):
            Method for selecting top-k experts.
        """

    assert _kinds(Config, "mlp_layer_types") == ["dense", "sparse"]
    assert _kinds(Config, "layer_types") == []


def test_a_processor_setting_left_none_is_taken_from_the_config_field_of_its_name():
    processor = SimpleNamespace(patch_size=None, image_token="<image>", downsample_rate=None, _private=None)
    config = {"downsample_rate": "1/2", "vision_config": {"patch_size": 16}, "_private": 3}
    processor_from_config(processor, config)
    assert (processor.patch_size, processor.downsample_rate, processor._private) == (16, "1/2", None)


def test_stated_fields_reach_nested_configs():
    config = {"text_config": {"indexer_budget": None}}
    stated_fields(config, "qwen4_exp")
    assert config["text_config"]["indexer_budget"] == STATED["qwen4_exp"]["text_config.indexer_budget"]
    assert config["text_config"]["indexer_budget"] % config["text_config"]["indexer_compress_ratio"] == 0


def test_a_config_built_with_stated_fields_is_edited_without_editing_the_next_build():
    """test_vlm_sweep narrows Perception LM's ``model_args`` in place: the next build in the same process (another
    module's) must still get the stated 448-px side."""
    first, second = ({"vision_config": {}} for _ in range(2))
    stated_fields(first, "perception_lm")
    first["vision_config"]["model_args"]["img_size"] = 112
    stated_fields(second, "perception_lm")
    assert second["vision_config"]["model_args"]["img_size"] == 448


def test_canvases_the_crop_side_does_not_divide_are_cut_into_their_common_divisor():
    class Size(SimpleNamespace):
        pass

    images = SimpleNamespace(image_grid_pinpoints=[[336, 672], [672, 336], [1008, 336]], crop_size=Size(height=224,
                             width=224), size=Size(shortest_edge=224))
    assert pinpoint_side(SimpleNamespace(image_processor=images)) == 336
    assert (images.crop_size.height, images.crop_size.width, images.size.shortest_edge) == (336, 336, 336)
    images.image_grid_pinpoints, images.crop_size = [[448, 896]], Size(height=224, width=224)  # 224 divides them
    assert pinpoint_side(SimpleNamespace(image_processor=images)) is None and images.crop_size.height == 224


def test_the_tower_takes_the_image_processors_vision_named_patch_over_its_crop_side():
    from bench.census_vlm_rules import tower_field

    # Step 3.7's image processor: patch_size 504 is its local crops' side, vision_patch_size 14 the tower's patch
    assert tower_field(SimpleNamespace(patch_size=504, vision_patch_size=14), "patch_size") == 14
    assert tower_field(SimpleNamespace(patch_size=16), "patch_size") == 16  # no vision_ one: its own
    assert tower_field(SimpleNamespace(merge_size=2, vision_merge_size=None), "merge_size") == 2


def test_a_window_is_filled_where_layers_slide_or_the_code_builds_a_sliding_mask_whatever_they_are(monkeypatch):
    import inspect
    import sys
    import types

    from bench.census_vlm_rules import UNGUARDED_WINDOW, WINDOW, filled

    def model_class(code):  # a model class whose module's source is ``code``
        module = types.ModuleType(f"census_rules_fake_{len(code)}")
        module.__source__ = code
        monkeypatch.setitem(sys.modules, module.__name__, module)
        return type("Fake", (), {"__module__": module.__name__})

    monkeypatch.setattr(inspect, "getsource", lambda obj: obj.__source__)
    guarded = model_class('if self.has_sliding_layers:\n    m["sliding_attention"] = create_sliding_window_c')
    full = {"text_config": {"sliding_window": None, "layer_types": ["full_attention"] * 2}}
    filled(full, guarded)
    assert full["text_config"]["sliding_window"] is None  # full layers, a guarded mask: no window needed
    sliding = {"text_config": {"sliding_window": None, "layer_types": ["sliding_attention", "full_attention"]}}
    filled(sliding, guarded)
    assert sliding["text_config"]["sliding_window"] == WINDOW == 32
    unguarded = model_class("mapping = {\n    " + UNGUARDED_WINDOW + "**kwargs),\n}")
    filled(full, unguarded)  # Step 3.7's: the sliding mask built though every layer is full
    assert full["text_config"]["sliding_window"] == 32


def test_expert_groups_keep_two_experts_each_and_divide_the_shrunk_experts():
    from bench.census_vlm_rules import expert_groups

    # DeepSeek-V3's router (Kimi K2.5's language model): 4 experts in the default's 8 groups would be 4 // 8 = 0 a
    # group; the top 2 of each group needs 2, so 2 groups of 2, and at most those 2 chosen
    config = {"text_config": {"n_routed_experts": 4, "n_group": 8, "topk_group": 4}}
    expert_groups(config)
    assert (config["text_config"]["n_group"], config["text_config"]["topk_group"]) == (2, 2)
    six = {"num_local_experts": 6, "n_group": 4, "topk_group": 1}  # 6 // 4 = 1 a group: 3 groups of 2
    expert_groups(six)
    assert (six["n_group"], six["topk_group"]) == (3, 1)
    fine = {"n_routed_experts": 8, "n_group": 2, "topk_group": 1}  # 4 a group already: left as they are
    expert_groups(fine)
    assert (fine["n_group"], fine["topk_group"]) == (2, 1)


def test_the_patch_is_read_from_query_counts_the_config_and_processor_both_map():
    from bench.census_vlm_rules import patch_of_counts

    # Aria: 1225 = 35^2 patches over a 490-px side, 4900 = 70^2 over 980 px, both 14-px patches (its default tower
    # says 32, which cuts 980 px into 30^2 = 900, a count the projector has no queries for)
    config = {"projector_patch_to_query_dict": {1225: 128, 4900: 256}, "vision_config": {"patch_size": 32}}
    processor = SimpleNamespace(size_conversion={490: 128, 980: 256}, image_token="<|img|>")
    assert patch_of_counts(config, processor) == 14 and config["vision_config"]["patch_size"] == 14
    config = {"counts": {1225: 128, 4900: 256}, "vision_config": {"patch_size": 32}}  # sides that disagree
    assert patch_of_counts(config, SimpleNamespace(size_conversion={490: 128, 700: 256})) is None
    assert config["vision_config"]["patch_size"] == 32


def test_a_timm_tower_without_sizes_is_built_tiny_from_its_entry_points_model_args():
    from bench.census_vlm_rules import timm_tower

    class Size(SimpleNamespace):
        pass

    # FastVLM's default tower: timm's fastvit_mci3, layers (2, 12, 24, 4, 2), embed_dims (96, ..., 1536) in
    # timm's entry point; depths 1 each, widths over 1536 // 64 = 24; FastViT's head widens the last stage by its
    # cls_ratio 2.0 (64 -> 128); a stem of stride 4 and four downsamplings of 2: 64 px a token, which 224 does not
    # divide, so the image processor takes the tower's default 256-px input
    config = {"vision_config": {"model_type": "timm_wrapper", "architecture": "fastvit_mci3",
                                "model_args": {"inference_mode": True}, "hidden_size": 3072}}
    processor = SimpleNamespace(patch_size=None, image_processor=SimpleNamespace(
        crop_size=Size(height=224, width=224), size=Size(shortest_edge=224)))
    args = timm_tower(config, processor)
    assert args["layers"] == (1, 1, 1, 1, 1) and args["embed_dims"] == (4, 8, 16, 32, 64) and args["inference_mode"]
    assert config["vision_config"]["hidden_size"] == 128 and processor.patch_size == 64
    assert (processor.image_processor.crop_size.height, processor.image_processor.size.shortest_edge) == (256, 256)
    stated = {"vision_config": {"model_type": "timm_wrapper", "architecture": "vit_pe_core_large_patch14_336",
                                "model_args": {"embed_dim": 32, "depth": 2}}}  # Perception LM's: sizes stated
    assert timm_tower(stated, processor) is None and stated["vision_config"]["model_args"] == {"embed_dim": 32,
                                                                                                "depth": 2}


def test_a_placeholder_the_processor_never_expands_is_written_out_once_per_image_feature():
    import torch

    from bench.census_vlm import TEMPLATE, _written_out

    class Processor(SimpleNamespace):  # expands nothing: the prompt's ids as the template wrote them
        def apply_chat_template(self, messages, add_generation_prompt):
            return "user: <image> what"

        def __call__(self, images, text, return_tensors):
            return {"input_ids": torch.tensor([self.ids]), "pixel_values": torch.zeros(1, 3, 8, 8)}

    words = SimpleNamespace(unk_token_id=0, convert_tokens_to_ids=lambda t: {"<image>": 9}.get(t, 0))
    class Model:  # its module's code checks one token per feature, as GOT-OCR2's: "image tokens do not match"
        config = SimpleNamespace(image_token_index=1)

        def get_image_features(self, pixel_values):
            return torch.zeros(1, 6, 4)

    # PP-Chart2Table's: one placeholder, 6 features (1, 6, 4) from the model's own get_image_features
    model = Model()
    cross = SimpleNamespace(config=SimpleNamespace(image_token_index=1),  # a module with no such check (types)
                            get_image_features=lambda pixel_values: torch.zeros(1, 6, 4))
    assert _written_out(cross, Processor(ids=[2, 9, 4], chat_template="kept"), words, "<image>") is None
    processor = Processor(ids=[2, 9, 4], chat_template="")
    assert _written_out(model, processor, words, "<image>") == 6
    assert model.config.image_token_index == 9
    assert processor.chat_template == TEMPLATE.replace("IMAGE", "<image> <image> <image> <image> <image> <image>")
    twice = Processor(ids=[9, 9, 4], chat_template="kept")  # already expanded: left as it is
    assert _written_out(model, twice, words, "<image>") is None and twice.chat_template == "kept"
    assert _written_out(model, Processor(ids=[0, 4], chat_template=""), words, "<unknown>") is None


def test_the_processors_frames_follow_the_towers_patch_embedding():
    import torch

    from bench.census_vlm import _frames_agreed

    for embedding, frames in ((torch.nn.Linear(3 * 14 * 14, 8), 1), (torch.nn.Linear(2 * 3 * 14 * 14, 8), 2),
                              (torch.nn.Conv3d(3, 8, (1, 14, 14)), 1), (torch.nn.Conv3d(3, 8, (2, 14, 14)), 2),
                              (torch.nn.Conv2d(3, 8, 14, 14), 1), (torch.nn.Conv2d(6, 8, 14, 14), 2)):
        images = SimpleNamespace(patch_size=14, temporal_patch_size=2)
        _frames_agreed(torch.nn.Sequential(embedding, torch.nn.Linear(8, 3 * 14 * 14)),
                       SimpleNamespace(image_processor=images))
        assert images.temporal_patch_size == frames


def test_widths_no_size_name_covers_are_capped_by_how_their_names_end():
    """The generic builder's ``_shrunk``: an MLP's or expert's inner width (SAM's ``mlp_dim``, a shared expert's
    ``*_intermediate_size``, T5's ``d_ff``, a projector's ``*_hidden_dim``) at most twice the tiny hidden size, a
    convolution's channels (SAM's neck) and an embedding's width at most the hidden size, a ``*_dim(s)`` its config
    states equal to that embedding's shrunk with it (Gemma 4 Unified's), an image's 3 channels kept; a smaller width
    kept as it is."""
    from bench.census_vlm import SIZES, _shrunk

    hidden = SIZES["hidden_size"]
    config = _shrunk({"hidden_size": 768, "mlp_dim": 3072, "moe_shared_expert_intermediate_size": 7688, "d_ff": 2048,
                      "share_expert_dim": 1280, "output_channels": 256, "post_conv_mid_channels": 512,
                      "num_channels": 3, "ffn_dim": 48, "projection_hidden_dim": 4096,
                      "mm_embed_dim": 3840, "output_proj_dims": 3840, "patch_dim": 6912,
                      "sam_config": {"model_type": "x", "hidden_size": 768, "mlp_dim": 3072}})
    assert (config["mlp_dim"], config["moe_shared_expert_intermediate_size"], config["d_ff"],
            config["share_expert_dim"], config["projection_hidden_dim"], config["sam_config"]["mlp_dim"]) == (
        2 * hidden,) * 6
    assert (config["output_channels"], config["post_conv_mid_channels"]) == (hidden, hidden)
    assert (config["mm_embed_dim"], config["output_proj_dims"]) == (hidden, hidden)
    assert (config["num_channels"], config["ffn_dim"], config["patch_dim"]) == (3, 48, 6912)



def test_a_mamba_mixers_widths_are_narrowed_together_and_only_an_ssms_chunk_is_cut():
    """Nemotron-H's default Mamba (128 heads of 64 over a state of 128, 8 groups, chunks of 128): 4 heads of 16
    (twice the tiny hidden size), a state of 16, groups dividing the heads, chunks of 16; a ``chunk_size`` beside no
    SSM state (Pi0's actions') kept. transformers' own config class takes it: test_vlm_census_built."""
    from bench.census_vlm import SIZES, _shrunk

    config = _shrunk({"hidden_size": 2688, "mamba_num_heads": 128, "mamba_head_dim": 64, "ssm_state_size": 128,
                      "n_groups": 8, "chunk_size": 128})
    assert config == {"hidden_size": SIZES["hidden_size"], "mamba_num_heads": 4, "mamba_head_dim": 16,
                      "ssm_state_size": 16, "n_groups": 4, "chunk_size": 16}
    assert config["mamba_num_heads"] * config["mamba_head_dim"] == 2 * SIZES["hidden_size"]
    assert _shrunk({"hidden_size": 64, "chunk_size": 50, "n_groups": 8}) == {"hidden_size": 32, "chunk_size": 50,
                                                                            "n_groups": 8}
