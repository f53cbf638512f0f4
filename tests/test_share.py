"""A view in its URL (issue 50): the codec's round trip, every refusal, and the store of recent uploads."""

import hashlib

import pytest

from vit.app import share
from vit.app.uploads import MAX_NAME_CHARS, Upload, UploadStore, upload_digest

NAMES = {"cifar10-cifar-s": "/srv/checkpoints/cifar10-cifar-s.pt"}
DIGEST = hashlib.sha256(b"an image").hexdigest()


def test_every_setting_survives_the_round_trip_through_the_url():
    params = {"model": "cifar10-cifar-s", "sample": "cat 3.png", "size": "448", "aspect": "1", "invert": "0",
              "map": "legrad", "registers": "hidden", "class": "2", "query": "17", "layer": "4", "head": "3",
              "fusion": "max", "end": "5", "discard": "0.35", "opacity": "0.45", "cmap": "viridis", "scale": "zero",
              "upsample": "bilinear", "grid": "1", "mass": "0.6", "labels": "a dog, a cat", "sae": "org/sae",
              "sae_layer": "6", "feature": "1234", "ablate": "3.5,12.1"}
    values, notes = share.decode(params, NAMES, may_open=True)
    assert notes == []
    assert values["model"] == share.Model("name", "cifar10-cifar-s", NAMES["cifar10-cifar-s"])
    assert values["opacity"] == 0.45 and values["layer"] == 4 and values["ablate"] == ("3.5", "12.1")
    assert share.encode(values) == params
    assert share.decode(share.encode(values), NAMES, may_open=True) == (values, [])


def test_an_upload_is_named_by_the_sha256_of_its_bytes():
    values, notes = share.decode({"upload": DIGEST}, NAMES, may_open=False)
    assert values == {"upload": DIGEST} and notes == []
    assert upload_digest(b"an image") == DIGEST


@pytest.mark.parametrize("name, value, why", [
    ("layer", "0", "from 1 to 999999"), ("layer", "-1", "whole number"), ("layer", "2.5", "whole number"),
    ("instance", "1000000", "give a whole number from 1 to 999999"),  # issue 114: the upper bound named too
    ("query", "x", "whole number"), ("head", "1e3", "whole number"), ("size", "99999", "0 to 4096"),
    ("opacity", "1.5", "0 to 1"), ("opacity", "0.33", "steps of 0.05"), ("opacity", "nan", "0 to 1"),
    ("opacity", "inf", "0 to 1"),
    ("discard", "0.99", "0 to 0.95"), ("mass", "0", "0.05 to 0.95"),
    ("map", "<script>", "give one of"), ("cmap", "hot", "give one of"), ("fusion", "sum", "give one of"),
    ("scale", "", "give one of"), ("upsample", "cubic", "give one of"), ("registers", "1", "give one of"),
    ("aspect", "yes", "0 or 1"), ("grid", "2", "0 or 1"),
    ("sample", "../../etc/passwd", "file name"), ("sample", "a\u202egnp.exe", "file name"),
    ("upload", "abc", "64 hexadecimal"), ("upload", DIGEST.upper(), "64 hexadecimal"),
    ("ablate", "3.5;4.1", "LAYER.HEAD"), ("ablate", "0.1", "LAYER.HEAD"), ("labels", "  ", "some text"),
    ("theme", "dark", "no such setting"),
])
def test_a_bad_parameter_is_dropped_with_one_line_naming_it(name, value, why):
    values, notes = share.decode({name: value, "layer": "2"} if name != "layer" else {name: value}, NAMES, True)
    assert name not in values
    assert len(notes) == 1 and "\n" not in notes[0]
    assert notes[0].startswith(f"The link's {name}=") and why in notes[0]


def test_a_long_value_is_refused_before_it_is_parsed():
    values, notes = share.decode({"labels": "a" * (share.MAX_VALUE_CHARS + 1)}, NAMES, True)
    assert values == {} and "longer than" in notes[0] and len(notes[0]) < 200


def test_a_note_shows_invisible_characters_as_escapes():
    _, notes = share.decode({"map": "x\u202ey"}, NAMES, True)
    assert "\u202e" not in notes[0] and "\\u202e" in notes[0]


def test_a_model_is_named_by_its_catalogue_name_else_read_as_a_hub_id():
    assert share.model("cifar10-cifar-s", NAMES, False) == share.Model("name", "cifar10-cifar-s",
                                                                       NAMES["cifar10-cifar-s"])
    assert share.model("google/vit-base-patch16-224", NAMES, False) == share.Model("hub",
                                                                                   "google/vit-base-patch16-224")


@pytest.mark.parametrize("path", ["/etc/passwd", "/srv/checkpoints/cifar10-cifar-s.pt", "~/model.pt", "/dev/zero"])
def test_a_visitor_without_the_token_cannot_reach_a_path_through_a_link(path):
    # The access rule of "Open a path" (vit.runs.access) applies to links as to typed input.
    values, notes = share.decode({"model": path}, NAMES, may_open=False)
    assert "model" not in values
    assert len(notes) == 1 and share.PATH_REFUSED in notes[0]


def test_a_visitor_the_rule_allows_opens_a_path_through_a_link(tmp_path):
    mine = tmp_path / "mine.pt"
    mine.write_bytes(b"")
    values, notes = share.decode({"model": str(mine)}, NAMES, may_open=True)
    assert values["model"] == share.Model("path", str(mine), str(mine)) and notes == []


@pytest.mark.parametrize("text", ["/srv/models/gone.pt", "cifar10-gone", "", " "])
def test_a_link_to_a_model_that_does_not_exist_says_so_and_that_the_default_opened(text):
    values, notes = share.decode({"model": text, "layer": "2"}, NAMES, may_open=True)
    assert values == {"layer": 2}
    assert notes == [f"The link's model={text} was not used: this server has no model of that name or path, and "
                     "it is no Hub id; the default model opened instead."]


def test_a_visitor_without_the_token_gets_no_sae_through_a_link():
    # The Features section opens an SAE (a folder, or a Hub copy in the server's cache) only under the same rule.
    values, notes = share.decode({"sae": "/srv/sae", "feature": "3"}, NAMES, may_open=False)
    assert values == {"feature": 3} and "sae=" in notes[0] and "token" in notes[0]


def test_a_hub_id_with_a_revision_that_is_no_ref_is_dropped():
    values, notes = share.decode({"model": "google/vit-base-patch16-224@../../x"}, NAMES, may_open=True)
    assert values == {} and "no branch, tag or commit" in notes[0]


def test_a_link_with_both_a_sample_and_an_upload_shows_the_upload():
    values, notes = share.decode({"sample": "a.png", "upload": DIGEST}, NAMES, True)
    assert values == {"upload": DIGEST} and "upload is shown instead" in notes[0]


def test_settings_past_what_the_model_has_are_dropped_when_it_is_loaded():
    values, _ = share.decode({"layer": "13", "end": "12", "head": "12", "query": "197", "class": "3", "feature": "9",
                              "ablate": "12.13", "opacity": "0.5"}, NAMES, True)
    kept, notes = share.fit(values, layers=12, heads=12, tokens=197, classes=3, features=9)
    assert kept == {"end": 12, "head": 12, "opacity": 0.5}
    assert sorted(n.split("=")[0] for n in notes) == ["The link's ablate", "The link's class", "The link's feature",
                                                      "The link's layer", "The link's query"]
    assert any("this input has 197 tokens, 0 to 196" in n for n in notes)


def test_a_model_opened_by_path_is_named_by_its_path():
    class Entry:
        def __init__(self, name, path, source):
            self.name, self.path, self.source = name, path, source

    entries = [Entry("a", "/c/a.pt", "checkpoint"), Entry("a", "/runs/a/best.pt", "run"),
               Entry("b", "/tmp/b.pt", "file")]
    names = share.model_names(entries)
    assert names == {"a": "/c/a.pt"}
    assert share.model_text("/c/a.pt", "a", names) == "a"
    assert share.model_text("/runs/a/best.pt", "a", names) == "/runs/a/best.pt"  # the name is another's
    assert share.model_text("/tmp/b.pt", "b", names) == "/tmp/b.pt"


def test_the_upload_store_gives_back_the_bytes_by_their_hash_and_forgets_the_oldest_past_its_bound():
    store = UploadStore(max_bytes=10)
    first = store.put(b"12345")
    assert first == hashlib.sha256(b"12345").hexdigest() and store.get(first) == b"12345"
    second = store.put(b"abcde")
    third = store.put(b"ABCDE")  # 15 bytes: the least recently used goes
    assert store.get(first) is None and store.get(second) == b"abcde" and store.get(third) == b"ABCDE"
    assert store.get(hashlib.sha256(b"never").hexdigest()) is None


def test_an_upload_larger_than_the_store_is_not_kept():
    store = UploadStore(max_bytes=4)
    assert store.get(store.put(b"12345")) is None


def test_the_upload_store_keeps_the_file_name_cut_to_its_bound_and_counts_it():
    store = UploadStore(max_bytes=17)
    digest = store.put(b"12345", "<b>a</b>.png")  # 5 bytes and 12 characters: 17
    assert store.upload(digest) == Upload(b"12345", "<b>a</b>.png")
    assert store.upload(store.put(b"y", "abcdefghijklmnopq")) is None  # 1 byte and 17 characters exceed 17
    store = UploadStore()
    assert store.upload(store.put(b"x", "n" * 1000)).name == "n" * MAX_NAME_CHARS
