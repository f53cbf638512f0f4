"""tests/vit_commands.py: a command run in this process calls what its ``__main__`` calls, gives the status, stdout
and stderr a real process gives, and leaves nothing of its run behind (issue 112)."""

import importlib
import inspect
import logging
import os
import random
import signal
import sys
import types
import warnings

import torch
from vit_commands import entry, vit_command

COMMANDS = ("vit.predict", "vit.evaluate", "vit.convert", "vit.train", "vit.faithfulness", "vit.analyze", "vit.sae",
            "vit.describe_heads", "vit.explorer")


def test_a_run_in_this_process_calls_what_the_command_runs_and_answers_as_the_real_one():
    for name in COMMANDS:  # one test, not one per command: the everyday lane's count is a budget (tests/lanes.py)
        module = importlib.import_module(name)
        called = entry(module).__name__
        source = inspect.getsource(module.command)
        assert f"run_command({called})" in source or f"run_command(lambda: {called}(sys.argv[1:]))" in source, name
    here, real = (vit_command("vit.evaluate", "--help", in_process=flag) for flag in (True, False))
    assert (here.returncode, here.stdout, here.stderr) == (real.returncode, real.stdout, real.stderr)
    assert here.returncode == 0 and here.stdout.startswith("usage: python -m vit.evaluate ")


def leaky_main(argv):
    """A command that changes everything a run may change, then fails in one line."""
    os.environ["HF_HOME"] = "/changed"
    os.environ.pop("VIT_COMMANDS_PROBE", None)
    os.chdir("/")
    sys.argv.append("--changed")
    handler = logging.StreamHandler(sys.stderr)
    logging.getLogger("vit_probe").addHandler(handler)
    logging.getLogger("vit_probe").setLevel(logging.DEBUG)
    logging.getLogger().addHandler(handler)
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    warnings.simplefilter("error")
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    torch.manual_seed(123)
    random.seed(123)
    logging.getLogger("vit_probe").warning("logged")
    print("out", argv)
    raise SystemExit("vit_probe: error: one line")


def test_a_run_in_this_process_is_captured_and_leaves_nothing_behind(monkeypatch, tmp_path):
    probe = types.ModuleType("vit_commands_probe")
    probe.main, probe.__file__ = leaky_main, str(tmp_path / "probe.py")
    monkeypatch.setitem(sys.modules, "vit_commands_probe", probe)
    monkeypatch.setenv("VIT_COMMANDS_PROBE", "kept")
    environ, cwd, argv, argv_items = dict(os.environ), os.getcwd(), sys.argv, list(sys.argv)
    root_handlers = list(logging.getLogger().handlers)
    sigterm, sigint = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    filters, threads, grad = list(warnings.filters), torch.get_num_threads(), torch.is_grad_enabled()
    torch_rng, python_rng = torch.random.get_rng_state(), random.getstate()

    done = vit_command("vit_commands_probe", "a", 1, cwd=tmp_path, env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 1  # a SystemExit with a message, as Python (and run_command) exit with it
    assert done.stdout == "out ['a', '1']\n"
    assert done.stderr == "logged\nlogged\nvit_probe: error: one line\n"  # the logger's handler and the root's

    assert dict(os.environ) == environ and os.getcwd() == cwd
    assert sys.argv is argv and sys.argv == argv_items
    assert logging.getLogger().handlers == root_handlers
    assert logging.getLogger("vit_probe").handlers == [] and logging.getLogger("vit_probe").level == logging.NOTSET
    assert signal.getsignal(signal.SIGTERM) == sigterm and signal.getsignal(signal.SIGINT) == sigint
    assert warnings.filters == filters
    assert (torch.get_num_threads(), torch.is_grad_enabled()) == (threads, grad)
    assert torch.equal(torch.random.get_rng_state(), torch_rng) and random.getstate() == python_rng
