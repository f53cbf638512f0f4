"""What each map of a VLM's answer is called where a person reads it (issue 116): the explorer's "Map" picker, its
export and every refusal that points to another map name a map one way, from its key (``vlm_answer.MAP_METHODS``,
the API's ``method=``), so no refusal says "gradxattn" beside a button that says "gradient × attention"."""

from __future__ import annotations

TITLES = {"attention": "attention", "gradxattn": "gradient × attention",
          "gradxattn_rollout": "gradient × attention, all layers", "tam": "TAM (token activation map)",
          "attnlrp": "AttnLRP (to the pixels)"}


def either(*methods: str) -> str:
    """The maps a refusal points to, as the page names them: ``either("attention", "gradxattn")`` is
    'attention or gradient × attention'."""
    titles = [TITLES[method] for method in methods]
    return " or ".join([", ".join(titles[:-1]), titles[-1]] if len(titles) > 2 else titles)
