"""Every file the project writes for its user appears whole or not at all (issue 95, item 4: a killed rerun of
``vit.predict --save-maps`` left the earlier ``img.npz``, ``img_mask0.png`` and ``img_cls.png`` at 0 bytes).

- A kill is simulated at a writer's open: the file is opened (created, or truncated where the writer writes in
  place), then ``Killed`` is raised, a ``BaseException`` that passes every ``except Exception`` as SIGKILL does.
  Each writer of a command is killed in turn; the files of the run before must still hold what they held, and no
  temporary file is left beside them.
- A scan of ``vit/``, ``app_pages/`` and ``app.py`` fails on any new direct writer (a PIL, numpy or matplotlib
  save to a path, ``write_text`` / ``write_bytes``, an ``open`` for writing) outside the atomic writers of
  ``vit.core.runfiles``; the few files written otherwise are listed with their reason.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import io
import os
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vit
from vit import predict as predict_cli
from vit.api import Segmentation, WordMap
from vit.checkpoint import save_checkpoint
from vit.model import ViT, ViTConfig

ROOT = Path(__file__).resolve().parent.parent
TINY = ViTConfig(image_size=16, patch_size=4, hidden_size=16, num_layers=2, num_heads=2, mlp_size=32,
                 num_classes=3)
CLASSES = ["cat", "dog", "ship"]


class Killed(BaseException):
    """The process killed at a writer's open."""


WRITE_MODE = set("wax+")  # an open() mode that creates, truncates or changes the file
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND  # O_TMPFILE comes with one of them


class Opens:
    """Counts the opens for writing of paths in ``folder`` (``open``, ``io.open``, ``os.open``: PIL, zipfile,
    matplotlib, pathlib and the atomic writers all open through one of them) and kills the ``kill_at``-th."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, folder: Path, kill_at: int | None = None):
        self.folder, self.kill_at, self.count = folder.resolve(), kill_at, 0
        real_open, real_os_open = builtins.open, os.open

        def patched_open(file, mode="r", *args, **kwargs):
            f = real_open(file, mode, *args, **kwargs)
            if set(mode) & WRITE_MODE and self._inside(file):
                self._opened(f.close)
            return f

        def patched_os_open(path, flags, *args, **kwargs):
            fd = real_os_open(path, flags, *args, **kwargs)
            if flags & WRITE_FLAGS and self._inside(path):
                self._opened(lambda: os.close(fd))
            return fd

        monkeypatch.setattr(builtins, "open", patched_open)
        monkeypatch.setattr(io, "open", patched_open)
        monkeypatch.setattr(os, "open", patched_os_open)

    def _inside(self, file) -> bool:
        if isinstance(file, int):
            return False
        path = Path(os.fsdecode(os.fspath(file))).resolve()
        return path == self.folder or self.folder in path.parents

    def _opened(self, close: Callable[[], None]) -> None:
        index, self.count = self.count, self.count + 1
        if index == self.kill_at:
            close()
            raise Killed(f"killed at open {index}")


def contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def assert_whole(folder: Path, before: dict[str, bytes]) -> None:
    """Every file of ``before`` still holds what it held: the same bytes, or for a ``.npz`` rewritten whole before
    the kill, the same arrays (a zip entry keeps the time it was written); and nothing else is in ``folder``."""
    after = contents(folder)
    assert sorted(after) == sorted(before), "a temporary file was left, or a file is gone"
    for name, old in before.items():
        if after[name] == old:
            continue
        assert name.endswith(".npz"), f"{name} changed: {len(old)} bytes before, {len(after[name])} now"
        with np.load(io.BytesIO(old)) as a, np.load(io.BytesIO(after[name])) as b:
            assert sorted(a.files) == sorted(b.files)
            for key in a.files:
                np.testing.assert_array_equal(a[key], b[key])


def assert_every_kill_leaves_the_files_whole(monkeypatch, folder: Path, write: Callable[[], object]) -> None:
    """``write`` once, count its opens in a second run, then kill a rerun at each of them in turn."""
    write()
    before = contents(folder)
    assert before and all(before.values())
    with monkeypatch.context() as m:
        counted = Opens(m, folder)
        write()
    assert counted.count >= len(before)  # every file it writes is opened at least once
    for at in range(counted.count):
        with monkeypatch.context() as m, pytest.raises(Killed):
            Opens(m, folder, kill_at=at)
            write()
        assert_whole(folder, before)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path]:
    """(a tiny checkpoint, a 48 x 20 image)."""
    root = tmp_path_factory.mktemp("atomic")
    torch.manual_seed(0)
    save_checkpoint(root / "model.pt", ViT(TINY).eval(), CLASSES)
    image = root / "img.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (20, 48, 3), dtype=np.uint8), "RGB").save(image)
    return root / "model.pt", image


# ---------------------------------------------------------------------------------------------
# vit.predict --save-maps


def test_a_rerun_of_predict_save_maps_killed_at_each_writers_open_leaves_the_earlier_maps_whole(
        tiny, tmp_path, monkeypatch, capsys):
    checkpoint, image = tiny
    maps = tmp_path / "maps"

    def write():
        assert predict_cli.main([str(checkpoint), str(image), "--save-maps", str(maps)]) == 0

    assert_every_kill_leaves_the_files_whole(monkeypatch, maps, write)
    assert sorted(contents(maps)) == ["img.npz", "img_cls.png", "img_rollout.png"]


def fake_segmentation(image: Image.Image) -> Segmentation:
    """SAM's answer as ``vit.segment`` gives it, made by hand: two masks, one decoder attention, one map."""
    rng = np.random.default_rng(0)
    masks = np.zeros((2, image.height, image.width), dtype=bool)
    masks[0, :10, :20], masks[1, 5:, 10:] = True, True
    return Segmentation(scores=np.array([0.9, 0.4], dtype=np.float32),
                        mask_logits=rng.standard_normal((2, 8, 8)).astype(np.float32), masks=masks, mask=0,
                        token="mask", attention={"final_attn_token_to_image": rng.random((2, 4, 4), np.float32)},
                        maps={"gradient_x_input": rng.standard_normal((4, 4)).astype(np.float32)},
                        patch_maps={"gradient_x_input": rng.standard_normal((2, 2)).astype(np.float32)},
                        image=image, seen=image, input_box=(0.0, 0.0, float(image.width), float(image.height)),
                        points=((5.0, 5.0, 1),), box=(1.0, 1.0, 30.0, 15.0))


def test_a_rerun_of_a_sam_prompts_save_maps_killed_at_each_writers_open_leaves_the_earlier_maps_whole(
        tiny, tmp_path, monkeypatch, capsys):
    import vit.api
    import vit.explain.methods.segment

    _, image = tiny
    with Image.open(image) as opened:
        done = fake_segmentation(opened.convert("RGB"))
    monkeypatch.setattr(vit.explain.methods.segment, "segmenter", lambda *args: None)
    monkeypatch.setattr(vit.api, "segment", lambda *args, **kwargs: done)
    maps = tmp_path / "maps"
    args = predict_cli.build_parser().parse_args(["sam", str(image), "--points", "5,5", "--save-maps", str(maps)])

    def write():
        assert predict_cli.run_prompts(None, args) == 0

    assert_every_kill_leaves_the_files_whole(monkeypatch, maps, write)
    assert sorted(contents(maps)) == ["img.npz", "img_final_attn_token_to_image.png", "img_gradient_x_input.png",
                                      "img_mask0.png", "img_mask1.png"]


# ---------------------------------------------------------------------------------------------
# The notebook API's .save and .to_html


@pytest.fixture(scope="module")
def results(tiny) -> dict[str, Callable[[Path], object]]:
    """Each result of the notebook API that writes files, by what it writes: ``write(folder)``."""
    checkpoint_path, image_path = tiny
    checkpoint = vit.load(checkpoint_path, device="cpu")
    with Image.open(image_path) as opened:
        image = opened.convert("RGB")
    explanation = vit.explain(checkpoint, image, "attention")
    word = WordMap(**{f.name: getattr(explanation, f.name) for f in dataclasses.fields(explanation)}, word="cat",
                   token_ids=(7,), units=explanation.map.copy())
    made = {"explanation": explanation, "pca": vit.pca(checkpoint, image),
            "similarity": vit.similarity(checkpoint, image, query=1),
            "correspondences": vit.correspondences(checkpoint, image, checkpoint, image, top=3),
            "word": word, "segmentation": fake_segmentation(image)}
    writers = {f"{name}.save": (lambda folder, r=r: (r.save(folder / "map.png"), r.save(folder / "map.npz")))
               for name, r in made.items()}
    writers["explanation.to_html"] = lambda folder: explanation.to_html(folder / "view.html")
    return writers


@pytest.mark.parametrize("writer", ["explanation.save", "pca.save", "similarity.save", "correspondences.save",
                                    "word.save", "segmentation.save", "explanation.to_html"])
def test_a_save_of_the_notebook_api_killed_at_its_open_leaves_the_earlier_file_whole(
        results, writer, tmp_path, monkeypatch):
    folder = tmp_path / "out"
    folder.mkdir()
    assert_every_kill_leaves_the_files_whole(monkeypatch, folder, lambda: results[writer](folder))


# ---------------------------------------------------------------------------------------------
# No new in-place writer

SCANNED = ("vit", "app_pages", "app.py")
SAVERS = {"save", "savez", "savez_compressed", "savefig", "imsave", "imwrite", "tofile"}  # x.save(file, ...)
PATH_WRITERS = {"write_text", "write_bytes"}
OPENERS = {"open", "fdopen", "ZipFile", "TarFile"}
COPIERS = {"copy", "copy2", "copyfile", "copyfileobj", "copytree", "move"}
MODE = re.compile(r"[rwaxbt+]{1,4}")
# (file, function, call): each file written otherwise than by vit.core.runfiles' atomic writers, and why.
ALLOWED = {
    ("vit/core/runfiles.py", "atomic_write_bytes", "open"): "the atomic writer itself: its temporary file",
    ("vit/core/runfiles.py", "atomic_write_files", "open"): "the atomic writer of a set of files: their temporary "
                                                            "files, renamed once all are written",
    ("vit/core/runfiles.py", "unnamed_until_done", "os.open"): "the streaming atomic writer: an unnamed file (Linux)",
    ("vit/core/runfiles.py", "unnamed_until_done", "os.fdopen"): "the same file",
    ("vit/core/runfiles.py", "unnamed_until_done", "open"): "its NAME.part elsewhere, or its copy without /proc",
    ("vit/core/runfiles.py", "unnamed_until_done", "shutil.copyfileobj"): "that copy",
    ("vit/core/runfiles.py", "append_traceback", "open"): "train.log is appended to; a torn last line is a log's",
    ("vit/training/trainer.py", "Trainer._step_row", "open"): "steps.jsonl is appended to; every reader skips a "
                                                              "torn last line",
    ("vit/runs/manager.py", "RunManager._locked", "open"): "the lock file: opened to lock, never written",
    ("vit/runs/manager.py", "RunManager._start", "open"): "the launched process's output.log, appended to",
    ("vit/checkpoint/torch_files.py", "atomic_torch_save", "os.fdopen"): "its own temporary file, fsync and rename, "
                                                                         "streamed: a checkpoint can be gigabytes",
    ("vit/explain/views/overlay.py", "write_npz_streamed", "zipfile.ZipFile"): "into unnamed_until_done's file",
    ("vit/explain/views/overlay.py", "write_npz_streamed", "archive.open"): "the entries of that archive",
    ("vit/training/data.py", "_decode_files", "request.write_text"): "a worker's request in a TemporaryDirectory",
    ("vit/training/data.py", "_decode_files", "open"): "a worker's log in that TemporaryDirectory",
    ("vit/training/decoding.py", "main", "np.save"): "the worker's result in the parent's TemporaryDirectory, "
                                                     "checked whole before it is read (data._read_share)",
    ("vit/training/decoding.py", "main", "out.with_suffix('.json').write_text"): "the same",
    ("vit/features/formats.py", "load_saev", "open"): "the archive after saev's header, in a TemporaryDirectory",
    ("vit/runs/ray_jobs.py", "code_package", "shutil.copyfile"): "the job's code, into a TemporaryDirectory",
    ("vit/sources/hub.py", "_bounded_tqdm.Bounded.__init__", "open"): "os.devnull, for a silent progress bar",
    ("vit/core/cli.py", "run_command", "os.open"): "os.devnull, put in place of stdout for a quiet exit",
    ("vit/predict.py", "run_prompts", "done.save"): "Segmentation.save, atomic itself (tested above)",
}


def _in_memory_targets(function: ast.AST) -> set[str]:
    """Names a writer may write to inside ``function``: buffers (``x = io.BytesIO()``), a lambda's parameters (the
    file ``atomic_write_with`` gives its callback), ``with ... as f`` targets."""
    names = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                pairs = zip(target.elts, node.value.elts, strict=False) if isinstance(target, ast.Tuple) and \
                    isinstance(node.value, ast.Tuple) else [(target, node.value)]
                for name, value in pairs:
                    if isinstance(name, ast.Name) and isinstance(value, ast.Call) and \
                            ast.unparse(value.func) in ("io.BytesIO", "BytesIO"):
                        names.add(name.id)
        elif isinstance(node, ast.Lambda):
            names.update(a.arg for a in node.args.args)
        elif isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name):
            names.add(node.optional_vars.id)
    return names


def _writes(call: ast.Call) -> bool:
    """Whether an ``open``-like call opens for writing: ``mode=``, else its second argument (``open(file, mode)``,
    ``archive.open(name, mode)``), else a method's only one (``path.open(mode)``); for ``os.open``, a flag that
    writes."""
    what = ast.unparse(call.func)
    if what == "os.open":
        flags = ast.unparse(call.args[1]) if len(call.args) > 1 else ""
        return any(f in flags for f in ("O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC"))
    modes = [k.value for k in call.keywords if k.arg == "mode"]
    if not modes and len(call.args) > 1:
        modes = [call.args[1]]
    elif not modes and call.args and isinstance(call.func, ast.Attribute) and what not in (
            "io.open", "builtins.open", "os.fdopen", "tarfile.open", "gzip.open", "bz2.open", "lzma.open"):
        modes = [call.args[0]]
    return any(isinstance(m, ast.Constant) and isinstance(m.value, str) and MODE.fullmatch(m.value)
               and set(m.value) & WRITE_MODE for m in modes)


def direct_writers(source: str) -> list[tuple[str, str, int]]:
    """(function, call, line) of each direct write to a file in ``source``, the call as written (``np.savez``)."""
    found = []

    def visit(node: ast.AST, scope: list[str], buffers: set[str]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scope = [*scope, node.name]
            if not isinstance(node, ast.ClassDef):
                buffers = buffers | _in_memory_targets(node)
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            what = ast.unparse(func)
            if name in SAVERS and isinstance(func, ast.Attribute):  # a bare save() (safetensors') returns bytes
                file = node.args[1] if what == "torch.save" and len(node.args) > 1 else \
                    (node.args[0] if node.args else None)  # torch.save(obj, f); the others take the file first
                written = not (isinstance(file, ast.Name) and file.id in buffers)
            elif name in OPENERS:
                written = _writes(node)
            else:
                written = name in PATH_WRITERS or (name in COPIERS and what.startswith("shutil."))
            if written:
                found.append((".".join(scope) or "<module>", what, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, scope, buffers)

    visit(ast.parse(source), [], set())
    return found


def scanned() -> dict[str, list[tuple[str, str, int]]]:
    """{file: its direct writers} for every module of ``SCANNED``."""
    files = []
    for name in SCANNED:
        path = ROOT / name
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return {p.relative_to(ROOT).as_posix(): direct_writers(p.read_text(encoding="utf-8")) for p in files}


def test_no_module_writes_a_file_in_place_outside_the_atomic_writers():
    found = [f"{file}:{line} {function}: {what}" for file, writers in scanned().items()
             for function, what, line in writers if (file, function, what) not in ALLOWED]
    assert not found, ("these write a file in place, so a kill leaves it half written; write through "
                       "vit.core.runfiles.atomic_write_bytes / atomic_write_text / atomic_write_with (or add the "
                       "place to ALLOWED with its reason):\n" + "\n".join(found))


def test_every_allowed_place_still_writes_so_the_list_does_not_outlive_its_reasons():
    present = {(file, function, what) for file, writers in scanned().items() for function, what, _ in writers}
    assert set(ALLOWED) <= present, sorted(set(ALLOWED) - present)


PROBE = '''
import io, os, shutil, zipfile
import numpy as np, torch

def writes(image, path, fig, arrays, model):
    image.save(path, format="PNG")
    np.savez_compressed(path, **arrays)
    np.save(path / "a.npy", arrays["a"])
    fig.savefig(path)
    torch.save(model, path)
    path.write_text("x")
    path.write_bytes(b"x")
    with open(path, "wb") as f:
        f.write(b"x")
    with path.open("a") as f:
        f.write("x")
    os.open(path, os.O_WRONLY | os.O_CREAT)
    zipfile.ZipFile(path, mode="w")
    shutil.copyfile(path, path)

def renders(image, arrays, fig, model):
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    np.savez_compressed(buffer, **arrays)
    fig.savefig(buffer, format="png")
    torch.save(model, buffer)
    with open("x", "rb") as f:
        f.read()
    os.open("x", os.O_RDONLY)
    return lambda f: image.save(f, format="PNG")
'''


def test_the_scan_finds_each_kind_of_in_place_writer_and_no_write_to_memory():
    assert [what for _, what, _ in direct_writers(PROBE)] == [
        "image.save", "np.savez_compressed", "np.save", "fig.savefig", "torch.save", "path.write_text",
        "path.write_bytes", "open", "path.open", "os.open", "zipfile.ZipFile", "shutil.copyfile"]
    assert {function for function, _, _ in direct_writers(PROBE)} == {"writes"}


KILLED_MID_WRITE = r"""
import os, signal, sys
from pathlib import Path
from vit.core import runfiles
os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)  # killed with its temporary file written, not renamed
runfiles.atomic_write_bytes(Path(sys.argv[1]), b"new")
"""


def test_a_save_killed_by_sigkill_leaves_a_temporary_file_a_later_write_beside_it_removes(tmp_path):
    """Issue 114, finding 6: each killed save left its ``.NAME.PID.THREAD.tmp`` beside the file for good. A later
    atomic write in the folder removes those of writers no longer alive once ``STRAY_SECONDS`` old; a live writer's
    stays (it is about to be renamed into place), as does a newer one (a writer on another host of a shared folder,
    whose pid this host does not know, moves its mtime as it writes)."""
    import subprocess
    import sys

    from vit.core.runfiles import atomic_write_bytes

    target = tmp_path / "maps.npz"
    target.write_bytes(b"old")
    done = subprocess.run([sys.executable, "-c", KILLED_MID_WRITE, str(target)], env={**os.environ,
                          "PYTHONPATH": str(ROOT)}, capture_output=True, timeout=120)
    assert done.returncode == -9, done.stderr
    [stray] = tmp_path.glob(".maps.npz.*.tmp")
    assert stray.read_bytes() == b"new" and target.read_bytes() == b"old"
    killed_at = stray.stat().st_mtime - 86400  # killed a day ago, past STRAY_SECONDS
    os.utime(stray, (killed_at, killed_at))
    newer = tmp_path / f"{stray.name.removesuffix('.tmp')}1.tmp"  # the same dead pid, written just now
    newer.write_bytes(b"writing")
    live = tmp_path / f".other.png.{os.getppid()}.1.tmp"  # a writer still alive
    live.write_bytes(b"writing")
    os.utime(live, (killed_at, killed_at))
    atomic_write_bytes(tmp_path / "other.png", b"png")  # a write of another file in the folder
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["maps.npz", "other.png", live.name, newer.name])
