"""A TextSpan text bank cannot hold the heavy-work slot (issue 77, item 4), and a tokenizer's Rust panic is one line
(item 8): a line longer than a text tower reads is refused before any text reaches the tokenizer; the bank's size is
checked before it is read; a stop reaches inside a batch of texts (after each text is tokenized); a
``tokenizer.json`` whose pre-tokenizer pattern backtracks past Oniguruma's retry limit (a ``PanicException``, a
``BaseException``) is a ``TextTowerError`` / ``WordEmbeddingError``.

The towers are tiny random CLIPs saved natively by open_clip and transformers (``test_prompts``); the tokenizers are
spied on at their class, so every text they are given is seen.
"""

import builtins
import json
import os
from pathlib import Path

import pytest
from PIL import Image
from test_prompts import save_open_clip
from test_text_tower_sizes import hf_clip_folder

import vit
from vit.app import work
from vit.explain.mechanism import textspan
from vit.explain.mechanism.components import MechanismError
from vit.sources.open import open_source
from vit.sources.vlm.text_tower import TextTowerError, open_text_tower

open_clip = pytest.importorskip("open_clip")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
pytestmark = pytest.mark.slow  # open_clip and transformers take seconds to import


@pytest.fixture(scope="module")
def clip_checkpoint(tmp_path_factory):
    return open_source(save_open_clip(tmp_path_factory.mktemp("clip") / "open_clip")[1])


@pytest.fixture
def seen(monkeypatch):
    """Every text open_clip's bundled BPE tokenizer (the tiny CLIP's) and transformers' CLIP tokenizer are given."""
    texts = []
    for cls in (open_clip.tokenizer.SimpleTokenizer, transformers.CLIPTokenizer):
        def spy(self, text, *args, _original=cls.__call__, **kwargs):
            texts.extend([text] if isinstance(text, str) else text)
            return _original(self, text, *args, **kwargs)

        monkeypatch.setattr(cls, "__call__", spy)
    return texts


def pictures(n=2):
    return [Image.new("RGB", (32, 32), (40 * i, 90, 200 - 40 * i)) for i in range(n)]


def test_a_line_longer_than_a_tower_reads_is_refused_before_the_tokenizer_sees_it(clip_checkpoint, seen, tmp_path):
    long = "a" * (textspan.MAX_TEXT_CHARS + 1)
    with pytest.raises(MechanismError, match=f"text 2 of the text bank is {len(long):,} characters long"):
        vit.textspan(clip_checkpoint, pictures(), ["a dog", long, "a cat"], layers=1, texts_per_head=1)
    assert max(map(len, seen), default=0) <= textspan.MAX_TEXT_CHARS
    bank = tmp_path / "bank.txt"
    bank.write_text(f"a dog\n\n{long}\n")
    with pytest.raises(MechanismError, match="text 2 of the text bank .* over the 2,464 a text tower can read"):
        textspan.read_texts(bank)
    at_bound = "a " * (textspan.MAX_TEXT_CHARS // 2)  # a line at the bound is read as it is
    bank.write_text(f"a dog\n{at_bound}\n")
    assert textspan.read_texts(bank) == ["a dog", at_bound.strip()]


def test_a_bank_over_the_size_bound_is_refused_before_it_is_read(tmp_path, monkeypatch):
    bank = tmp_path / "bank.txt"
    with open(bank, "wb") as f:
        f.truncate(textspan.MAX_BANK_BYTES + 1)  # sparse: the size is declared, no byte written
    opened = []
    original = builtins.open

    def spy(file, *args, **kwargs):
        if Path(os.fspath(file)) == bank:
            opened.append(file)
        return original(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy)
    with pytest.raises(MechanismError, match="8.0 MB, over the 8 MB a text bank may have"):
        textspan.read_texts(bank)
    assert opened == []
    with pytest.raises(MechanismError, match="the uploaded text bank is 8.0 MB"):
        textspan.texts_from_bytes(b"a\n" * (textspan.MAX_BANK_BYTES // 2 + 1), "the uploaded text bank")


@pytest.mark.timeout(60)
def test_a_fifo_is_refused_not_read(tmp_path):
    fifo = tmp_path / "bank.txt"
    os.mkfifo(fifo)  # nothing ever writes to it: reading it would wait for ever
    with pytest.raises(MechanismError, match="is not a regular file"):
        textspan.read_texts(fifo)


@pytest.mark.parametrize("library", ["open_clip", "transformers"])
def test_a_stop_asked_inside_a_batch_of_texts_is_honoured_before_the_batch_ends(clip_checkpoint, seen, tmp_path,
                                                                                library):
    checkpoint = clip_checkpoint if library == "open_clip" else open_source(hf_clip_folder(tmp_path))
    tower = open_text_tower(checkpoint)
    texts = [f"a photo of thing number {i}" for i in range(40)]  # one batch (TEXT_BATCH is 256)
    running, calls = work.Work("key", "texts"), []

    def progress(done, total):  # the page's Work, asked to stop once the tokenizer has had five texts
        calls.append((done, total))
        if len(seen) >= 5:
            running.stop("stopped by the test")
        running(done, total)

    with pytest.raises(work.Stopped, match="stopped by the test"):
        textspan.encode_texts(tower.encode, texts, progress)
    assert len(seen) == 5  # five texts of the batch's 40 were tokenized, then the stop was honoured
    assert calls[-1] == (0, 40)  # inside the batch: no text encoded yet


def backtracking_tokenizer(folder):
    """``folder``'s tokenizer.json with a pre-tokenizer pattern that backtracks (``^(a+)+$`` on "aaa…!"), read as
    it is (``PreTrainedTokenizerFast``: transformers' CLIPTokenizer would rebuild its own pre-tokenizer)."""
    tokenizer = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex(r"^(a+)+$"), behavior="isolated")
    tokenizer.save(str(folder / "tokenizer.json"))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "PreTrainedTokenizerFast"}))


def test_a_tokenizer_whose_pattern_backtracks_is_one_line_not_a_rust_panic(tmp_path):
    folder = hf_clip_folder(tmp_path)
    backtracking_tokenizer(folder)
    tower = open_text_tower(open_source(folder))
    assert tower.encode(["a dog"]).shape == (1, 16)  # the pattern matches nothing here
    with pytest.raises(TextTowerError, match=r"the tokenizer of .* on 'aaaa.*' failed \(Onig: .*retry-limit"):
        tower.encode(["a" * 40 + "!"])


def test_a_vlm_tokenizer_whose_pattern_backtracks_is_one_line_not_a_rust_panic(tmp_path):
    from vit.sources.vlm.word_embeddings import WordEmbeddingError, encode_words

    vocabulary = {"[UNK]": 0, "a": 1, "dog": 2, "!": 3}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocabulary, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex(r"^(a+)+$"), behavior="isolated")
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                                "unk_token": "[UNK]"}))
    assert [w.ids for w in encode_words(tmp_path, ["dog"], len(vocabulary))] == [(2,)]
    with pytest.raises(WordEmbeddingError, match=r"the tokenizer of .* on 'aaaa.*' failed \(Onig: .*retry-limit"):
        encode_words(tmp_path, ["a" * 40 + "!"], len(vocabulary))
