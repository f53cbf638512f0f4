"""The commands' ``--help`` and usage errors answer before torch loads (issue 33, item 9: they took 6-16 s, most of
it importing torch, torchvision and the wings). Each runs in a fresh interpreter; the modules it imported are read
back from ``sys.modules`` at exit."""

import subprocess
import sys

import pytest

COMMANDS = ("predict", "evaluate", "convert", "train", "faithfulness", "analyze", "sae")
# Runs the command as ``python -m vit.NAME ARGS`` would, then prints which heavy packages it had imported.
PROBE = """
import runpy, sys
name, *sys.argv[1:] = sys.argv[1:]
sys.argv[0] = name
try:
    runpy.run_module(f"vit.{name}", run_name="__main__", alter_sys=True)
except SystemExit as e:
    code = e.code
heavy = sorted(m for m in ("torch", "torchvision", "numpy", "transformers", "timm", "ray", "PIL") if m in sys.modules)
print("IMPORTED", ",".join(heavy), file=sys.stderr)
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


def test_the_names_the_parsers_list_without_torch_are_the_ones_the_run_uses():
    from vit import faithfulness
    from vit.explain import faithfulness as scores
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
