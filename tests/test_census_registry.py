"""The census counts what the libraries register (bench/census_registry.py, issue 117): every model type of
transformers' vision auto-mappings, every timm architecture family, every open_clip config, each once. References:
the libraries' own registries."""

from dataclasses import dataclass, field

import open_clip
import pytest
import timm
from transformers.models.auto import modeling_auto

from bench.census_registry import registry_families, timm_families


@dataclass
class Family:  # the fields census_families.Family has that the registry reads and sets
    name: str
    library: str
    build: str
    attention: bool = True
    overrides: dict = field(default_factory=dict)
    named: bool = False
    note: str = ""
    registry: str = ""


def hf(name, cls, note="", **overrides):
    return Family(name, "transformers", cls, note=note, overrides=overrides)


def tm(name, arch, note="", **overrides):
    return Family(name, "timm", arch, note=note, overrides=overrides)


def test_every_registered_vision_family_is_counted_once_and_a_hand_tuned_one_keeps_its_build():
    hand = [hf("ViTDet", "VitDetModel"), hf("ViTDet again", "VitDetModel"), tm("timm CaiT", "cait_xxs24_224"),
            hf("a composite's vision tower", "BlipVisionModel")]
    families = registry_families(hand, Family, hf, tm)
    entries = [f.registry for f in families if f.registry]
    assert len(entries) == len(set(entries))
    expected = {f"transformers:{t}" for t in modeling_auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES}
    expected |= {f"transformers:{t}" for t in modeling_auto.MODEL_FOR_BACKBONE_MAPPING_NAMES}
    expected |= {f"transformers:{t}" for t in modeling_auto.MODEL_FOR_VIDEO_CLASSIFICATION_MAPPING_NAMES}
    expected |= {f"timm:{m}" for m in timm.list_modules() if timm.list_models(module=m)}
    expected |= {f"open_clip:{name}" for name in open_clip.list_models()}
    assert expected <= set(entries)
    by_entry = {f.registry: f for f in families}
    assert by_entry["transformers:vitdet"] is hand[0]  # the tuned entry stands for its type, once
    assert by_entry["timm:cait"] is hand[2]
    assert hand[1] in families and hand[3] in families  # the hand list's others still run
    assert timm_families()["cait"] in timm.list_models(module="cait")


def test_census_home_removed_only_by_its_maker(tmp_path):
    """The census's fresh home is removed at exit by the process that made it, never by a forked child."""
    import os

    from bench.census_home import remove_home

    home = tmp_path / "census-home-x"
    home.mkdir()
    remove_home(str(home), owner=os.getpid() + 1)  # a child: leaves it
    assert home.exists()
    remove_home(str(home), owner=os.getpid())
    assert not home.exists()


@pytest.mark.parametrize("module", ["bench.census_families", "bench.census_vlm"])
def test_importing_a_census_leaves_the_environment_alone(module):
    """A census run as a program works in a fresh, offline home; imported (by the tests), it set that home in the
    importing process's environment for good: a test worker then gave HF_HUB_OFFLINE=1 to every app server it
    started, which found the Hub offline (a browser test's failure in three gates)."""
    import json
    import subprocess
    import sys

    code = (f"import json, os; before = dict(os.environ); import {module}; "
            "print(json.dumps({k: v for k, v in os.environ.items() if before.get(k) != v}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {}
