"""The commands' ``--help`` and usage errors answer before torch loads (issue 33, item 9: they took 6-16 s, most of
it importing torch, torchvision and the wings). Each runs in a fresh interpreter; the modules it imported are read
back from ``sys.modules`` at exit."""

import os
import subprocess
import sys

import pytest

COMMANDS = ("predict", "evaluate", "convert", "train", "faithfulness", "analyze", "sae", "describe_heads")
# Runs the command as ``python -m vit.NAME ARGS`` would, then prints which heavy packages it had imported.
PROBE = """
import atexit, runpy, sys
name, *sys.argv[1:] = sys.argv[1:]
sys.argv[0] = name


def report():  # at exit, which vit.core.cli.finish reaches through atexit
    heavy = sorted(m for m in ("torch", "torchvision", "numpy", "transformers", "timm", "ray", "PIL")
                   if m in sys.modules)
    print("IMPORTED", ",".join(heavy), file=sys.stderr)


atexit.register(report)
runpy.run_module(f"vit.{name}", run_name="__main__", alter_sys=True)
"""


def imported_by(command: str, *args: str) -> tuple[str, str]:
    result = subprocess.run([sys.executable, "-c", PROBE, command, *args], capture_output=True, text=True,
                            timeout=120)
    line = next(line for line in result.stderr.splitlines() if line.startswith("IMPORTED"))
    return line.removeprefix("IMPORTED").strip(), result.stdout + result.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_help_answers_without_importing_torch(command):
    heavy, output = imported_by(command, "--help")
    assert "usage: python -m vit." in output
    assert heavy == "", f"vit.{command} --help imported {heavy}"


@pytest.mark.parametrize("command", COMMANDS)
def test_a_usage_error_answers_without_importing_torch(command):
    heavy, output = imported_by(command, "--no-such-option")
    assert f"vit.{command}: error: " in output and "Traceback" not in output
    assert heavy == "", f"vit.{command} with a bad option imported {heavy}"


# A misspelt option of each command, and the one meant (issue 69, item 11: no "did you mean").
MISSPELT = {"predict": (["m.pt", "x.jpg", "--sise", "2048"], "--size"),
            "evaluate": (["m.pt", "--data", "d", "--batch-sise", "8"], "--batch-size"),
            "convert": (["m.pt", "--ot", "x.pt"], "--out"),
            "train": (["--dataset", "cifar10", "--epocs", "3"], "--epochs"),
            "faithfulness": (["m.pt", "--data", "d", "--limt=3"], "--limit"),
            "analyze": (["m.pt", "--data", "d", "--pca-jiont"], "--pca-joint"),
            "sae": (["train", "m.pt", "--layr", "3"], "--layer"),
            "describe_heads": (["m.pt", "--data", "d", "--texts-per-haed", "3"], "--texts-per-head")}


@pytest.mark.parametrize("command", COMMANDS)
def test_a_misspelt_option_is_answered_with_the_closest_one_without_importing_torch(command):
    args, meant = MISSPELT[command]
    heavy, output = imported_by(command, *args)
    error = [line for line in output.splitlines() if not line.startswith("IMPORTED")]
    assert len(error) == 1 and error[0].startswith(f"vit.{command}: error: unrecognized arguments: ")
    assert error[0].endswith(f"; did you mean {meant}?")
    assert heavy == "", f"vit.{command} with a misspelt option imported {heavy}"


def test_a_misspelt_choice_or_subcommand_is_answered_with_the_closest_one():
    from vit import predict, sae

    with pytest.raises(predict.UsageError, match=r"invalid choice: 'cdua' .*; did you mean cuda\?$"):
        predict.build_parser().parse_args(["m.pt", "x.jpg", "--device", "cdua"])
    with pytest.raises(predict.UsageError, match=r"invalid choice: 'trian' .*; did you mean train\?$"):
        sae.build_parser().parse_args(["trian"])
    with pytest.raises(predict.UsageError, match=r"unrecognized arguments: --qqqqqq$"):  # nothing close: no guess
        predict.build_parser().parse_args(["m.pt", "x.jpg", "--qqqqqq"])


# Each command with a path that is not there, and its one line (issue 69, item 11: a missing file took 6 s to be
# reported, most of it importing torch). "{model}" is a file that exists: only its existence is read.
MISSING = {
    "predict": (["{tmp}/nope.pt", "{model}"], "checkpoint not found: {tmp}/nope.pt"),
    "predict-images": (["{model}", "{tmp}/a.jpg", "{tmp}/b.png"], "no such image file: {tmp}/a.jpg, {tmp}/b.png"),
    "evaluate": (["{model}", "--data", "{tmp}/nowhere"],
                 "--data {tmp}/nowhere is not a folder; give a folder with one subfolder per class"),
    "faithfulness": (["{tmp}/nope.pt", "--data", "{tmp}"], "checkpoint not found: {tmp}/nope.pt"),
    "analyze": (["{model}", "--data", "{tmp}/nowhere"],
                "--data {tmp}/nowhere is not a folder; give a folder with one subfolder per class"),
    "convert": (["{tmp}/nope.safetensors", "--out", "{tmp}/x.pt"], "checkpoint not found: {tmp}/nope.safetensors"),
    "convert-map": (["{model}", "--map", "{tmp}/m.json", "--out", "{tmp}/x.pt"],
                    "--map {tmp}/m.json: no such file; give the mapping --inspect drafted, completed"),
    "sae": (["train", "{model}", "--data", "{tmp}/nowhere", "--layer", "1", "--out", "{tmp}/sae"],
            "--data {tmp}/nowhere is not a folder; give a folder of images (any depth)"),
    "describe_heads": (["{model}", "--data", "{tmp}", "--texts", "{tmp}/bank.txt"],
                       "--texts {tmp}/bank.txt: no such file; give a text file with one description a line"),
}


@pytest.mark.parametrize("case", MISSING)
def test_a_missing_file_or_folder_is_reported_before_torch_loads(case, tmp_path):
    (tmp_path / "model.pt").write_bytes(b"not read: the command stops before opening it")
    args, expected = MISSING[case]
    fill = {"tmp": str(tmp_path), "model": str(tmp_path / "model.pt")}
    command = case.split("-")[0]
    result = subprocess.run([sys.executable, "-c", PROBE, command, *(a.format(**fill) for a in args)],
                            capture_output=True, text=True, timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and lines[0] == f"vit.{command}: error: {expected.format(**fill)}", result.stderr
    assert lines[1:] == ["IMPORTED"], f"vit.{command} imported {lines[1:]}"


def test_an_arch_no_library_reads_is_refused_before_torch_loads(tmp_path):
    # vit.convert and vit.evaluate took ~2 s of CPU (torch and every port imported) to refuse a mistyped --arch
    (tmp_path / "model.pt").write_bytes(b"not read: the command stops before opening it")
    model, line = str(tmp_path / "model.pt"), "error: --arch 'keras:vit' must be timm:NAME, torchvision:NAME, "
    for command, args in (("convert", [model, "--out", str(tmp_path / "x.pt")]),
                          ("evaluate", [model, "--data", str(tmp_path)])):
        result = subprocess.run([sys.executable, "-c", PROBE, command, *args, "--arch", "keras:vit"],
                                capture_output=True, text=True, timeout=120)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and lines[0].startswith(f"vit.{command}: {line}"), result.stderr
        assert lines[1:] == ["IMPORTED"], f"vit.{command} imported {lines[1:]}"


def test_a_model_path_that_reads_as_a_hub_id_is_left_to_the_hub():
    from vit.predict import UsageError, check_model_path

    check_model_path("google/vit-base-patch16-224")  # no such folder here: the Hub (or its cache) is asked
    check_model_path("vit_base_patch16_224.augreg_in21k")  # a timm name
    with pytest.raises(UsageError, match="^checkpoint not found: runs/best.pt$"):
        check_model_path("runs/best.pt")  # a weights file's name is a missing path, never a Hub id


def test_the_names_the_parsers_list_without_torch_are_the_ones_the_run_uses():
    from vit import faithfulness
    from vit.explain.benchmarks import metrics as scores
    from vit.model import PRESETS
    from vit.training.options import PRESET_NAMES

    assert PRESET_NAMES == tuple(PRESETS)
    assert faithfulness.METHOD_NAMES == tuple(scores.METHODS)
    assert faithfulness.REPLACEMENTS == scores.REPLACEMENTS


def test_a_process_that_imported_vit_freezes_its_objects_before_the_exit_collections():
    # Python's last collections at exit walk every live object (~330,000 with torch and torchvision: 1.3-2.4 s of
    # CPU); vit's atexit hook freezes them first, so a command, a Ray job's driver or the app server ends at once.
    probe = "import atexit, gc, vit; before = gc.get_freeze_count(); atexit._run_exitfuncs(); " \
            "print(before, gc.get_freeze_count())"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    before, after = map(int, result.stdout.split())
    assert before == 0 and after > 0


def test_a_process_with_triton_loaded_ends_without_nanobind_noise():
    # triton (which the CUDA torch wheels bring, and torchvision imports) is built with nanobind, whose leak check
    # at the interpreter's end listed every object a freeze kept alive: 27-31 lines under each command's last line.
    pytest.importorskip("triton")
    result = subprocess.run([sys.executable, "-c", "import vit, torchvision, triton._C.libtriton"],
                            capture_output=True, text=True, timeout=120, check=True)
    assert result.stderr == ""


def test_a_command_ends_through_finish_with_atexit_hooks_threads_and_its_status_but_no_teardown():
    # The fast exit of a command: everything Python's own exit does for the program (other threads joined, atexit
    # hooks, the streams flushed), and not the interpreter's teardown, whose last collections cost 1.3 s with
    # torch loaded (and print nanobind's noise with triton): a gc callback sees no collection after finish.
    probe = """
import atexit, gc, sys, threading, time
from vit.core.cli import finish
from concurrent.futures import ThreadPoolExecutor
pool = ThreadPoolExecutor(1)  # an idle worker (a server's pool) ends through threading's exit hooks
pool.submit(int).result()
threading.Thread(target=lambda: (time.sleep(0.3), print("thread done", flush=True))).start()
atexit.register(print, "atexit ran")
print("to stderr, unflushed", file=sys.stderr, end="")
gc.callbacks.append(lambda phase, info: phase == "start" and print("collected", file=sys.__stderr__, flush=True))
finish(3)
"""
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 3
    assert result.stdout == "thread done\natexit ran\n"
    assert result.stderr == "to stderr, unflushed"


def test_a_command_whose_reader_closes_the_pipe_ends_quietly():
    reader = subprocess.Popen(["head", "-c", "10"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    result = subprocess.run([sys.executable, "-c", "from vit.core.cli import run_command\n"
                             "run_command(lambda: [print('x' * 1000) for _ in range(1000)] and 0)"],
                            stdout=reader.stdin, stderr=subprocess.PIPE, text=True, timeout=120)
    reader.stdin.close()
    reader.wait(timeout=30)
    assert result.stderr == "" and result.returncode == 1


@pytest.mark.parametrize("command", COMMANDS)
def test_a_console_script_names_itself_in_its_usage_line(command):
    # What pip's console-script wrapper does: argv[0] is the script's path, then the entry point pyproject names.
    script = f"import sys; sys.argv[0] = '/env/bin/vit-{command}'; from vit.{command} import command; command()"
    result = subprocess.run([sys.executable, "-c", script, "--help"], capture_output=True, text=True, timeout=120)
    assert result.stdout.startswith(f"usage: vit-{command} "), result.stdout[:200] + result.stderr[-500:]


# What the explorer's first map needs not: model libraries load when a model needs them (vit.sources), torchvision
# (it loads torch._dynamo and inductor: 2-3 s) and scipy/networkx when a deletion curve or a flow is computed.
NOT_AT_START = ("torchvision", "torch._dynamo", "torch._inductor", "scipy", "networkx", "transformers", "timm",
                "open_clip", "huggingface_hub", "ray", "sklearn")
EXPLORER_PROBE = """
import ast, importlib, sys
for script in ("app.py", "app_pages/explorer.py"):
    for node in ast.parse(open(script).read()).body:  # the page's own imports, as its first run makes them
        if isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)
        elif isinstance(node, ast.ImportFrom):
            module = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(module, alias.name):
                    importlib.import_module(f"{node.module}.{alias.name}")
print(",".join(sorted(m for m in sys.argv[1].split(",") if m in sys.modules)))
"""


def test_the_explorer_page_imports_no_model_library_torchvision_or_scipy():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    result = subprocess.run([sys.executable, "-c", EXPLORER_PROBE, ",".join(NOT_AT_START)], capture_output=True,
                            text=True, timeout=300, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "", f"the explorer's imports loaded {result.stdout.strip()}"


# vit.train --ray only checks its arguments and submits a job: reading the presets (vit.model.config), the dataset
# and the device's spelling (vit.training.specs) loads no torch (1.6 s of the client's 2.6 s of CPU did).
# A local run's usage errors answer before torch too; only its last check, whether this machine has the device,
# loads it.
PARSE_PROBE = """
import sys
from vit.model import PRESETS, ViTConfig
loaded = ["torch" in sys.modules]
from vit.core.cli import UsageError
from vit.training.options import parse_args
out = sys.argv[1]
args = parse_args(["--ray", "http://127.0.0.1:8265", "--workers", "2", "--gpus-per-worker", "1", "--dataset",
                   "folder:/data/images", "--preset", "cifar-s", "--hidden-size", "96", "--out", out,
                   "--device", "cuda:1"])
loaded.append("torch" in sys.modules)
for argv in (["--dataset", "cifar10", "--out", out, "--lr", "0.001", "--min-lr", "0.1"],  # local: the last check
             ["--ray", "http://127.0.0.1:8265", "--dataset", "cifar10", "--out", out, "--device", "cdua"],
             ["--ray", "http://127.0.0.1:8265", "--dataset", "cifar10", "--out", out, "--device", "mps"]):
    try:
        parse_args(argv)
    except UsageError as e:
        print(e)
loaded.append("torch" in sys.modules)
print(args.device, args.ray, args.workers, args.hidden_size, isinstance(PRESETS["cifar-s"], ViTConfig))
print("TORCH", loaded)
"""


def test_a_ray_runs_arguments_and_a_local_runs_usage_errors_are_checked_without_torch(tmp_path):
    result = subprocess.run([sys.executable, "-c", PARSE_PROBE, str(tmp_path / "run")], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[:3] == ["--min-lr (0.1) must not exceed --lr (0.001)",
                         "--device 'cdua' is not a device; use auto, cpu, cuda or cuda:N",
                         "--device 'mps' is not supported; use auto, cpu, cuda or cuda:N"]
    assert lines[3] == "cuda:1 http://127.0.0.1:8265 2 96 True"
    assert lines[4] == "TORCH [False, False, False]", "reading the presets, a --ray run's or a usage error loaded torch"


def test_the_model_packages_names_load_with_their_modules_when_first_used():
    import importlib

    import vit.model

    for name in vit.model.__all__:  # every name is the object of the module that defines it
        value = getattr(vit.model, name)
        home = getattr(value, "__module__", None)
        if home and home.startswith("vit.model."):
            assert getattr(importlib.import_module(home), name) is value, name
    assert vit.model.blocks is importlib.import_module("vit.model.blocks")
    assert "ViT" in dir(vit.model)
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchName'"):
        vit.model.NoSuchName  # noqa: B018


# Strings --device may be given, each spelt as torch.device reads it or not (c10's Device parser), and the indices at
# its edges: stoi's range (an index past it torch refuses), a leading zero, a sign, spaces, case, unknown types.
DEVICE_STRINGS = ("cpu", "cuda", "cuda:0", "cuda:1", "cuda:7", "cuda:127", "cuda:255", "cuda:2147483647",
                  "cuda:2147483648", "cuda:99999999999", "cuda:01", "cuda:00", "cuda:-1", "cuda:+1", "cuda:",
                  "cuda:x", "cuda:1a", "cuda:0:1", "cuda: 1", "cuda:１", " cuda", "cuda ", "cuda\n", "CUDA", "Cuda:0",
                  "cpu:0", "cpu:1", "cpu:00", "mps", "mps:0", "meta", "meta:5", "xla:3", "hpu", "xpu", "ipu", "mtia",
                  "lazy", "vulkan", "ve", "fpga", "maia", "mkldnn", "opengl", "opencl", "ideep", "hip",
                  "privateuseone", "ort", "msnpu", "metal", "gpu", "bogus", "cu_da", "_", "a_b", ":0", "", "auto",
                  "cudа")  # the last with a Cyrillic a


def test_the_device_spelling_checked_without_torch_is_torch_devices():
    import warnings

    import torch

    from vit.training.specs import device_spelling

    for spec in DEVICE_STRINGS:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # mkldnn: "no longer used as device type"
                device = torch.device(spec)
        except RuntimeError:
            assert device_spelling(spec) is None, f"{spec!r}: torch.device refuses it"
        else:
            assert device_spelling(spec) == (device.type, int(spec.partition(":")[2]) if ":" in spec else None), \
                f"{spec!r}: torch.device reads it as {device}"
