"""A VLM answer's maps are named one way everywhere a person reads them (issue 116, item 11): the explorer's Map
picker (``vlm_ask.METHOD_LABELS``) and every refusal that points to another map read ``answer_maps.TITLES``."""

from vit.explain.language.answer_maps import TITLES, either
from vit.explain.language.vlm_answer import MAP_METHODS


def test_every_map_of_an_answer_has_its_title_and_the_page_shows_it():
    from vit.app.vlm_ask import METHOD_LABELS

    assert set(TITLES) == set(MAP_METHODS)
    assert METHOD_LABELS == {"attention": "attention", "gradxattn": "gradient × attention",
                             "gradxattn_rollout": "gradient × attention, all layers",
                             "tam": "TAM (token activation map)", "attnlrp": "AttnLRP (to the pixels)"}


def test_a_refusal_names_the_maps_it_points_to_as_the_page_does():
    assert either("attention", "gradxattn") == "attention or gradient × attention"
    assert either("gradxattn", "tam") == "gradient × attention or TAM (token activation map)"
    assert either("tam") == "TAM (token activation map)"
    assert either("attention", "gradxattn", "tam") == "attention, gradient × attention or TAM (token activation map)"
