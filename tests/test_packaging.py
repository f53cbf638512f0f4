"""``pip install`` of the project: pyproject.toml declares requirements.txt's dependencies, every package, the app's
files and the console commands; the built wheel, installed into a fresh environment, works from another folder."""

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest
from helpers import free_port, wait_for_health

from vit import explorer

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
COMMANDS = ("predict", "train", "evaluate", "convert", "analyze", "faithfulness", "sae", "describe_heads")


def requirement_lines(path: Path) -> set[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return {line for line in lines if line and not line.startswith(("-r", "-c"))}


def pins(path: Path) -> dict[str, str]:
    """constraints.txt's ``name==version`` lines, by canonical name."""
    from packaging.utils import canonicalize_name

    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return {canonicalize_name(name): version for name, version in
            (line.split("==") for line in lines if line)}


def test_the_dependencies_are_requirements_txt_with_ray_as_an_extra():
    project = PYPROJECT["project"]
    assert set(project["dependencies"]) | set(project["optional-dependencies"]["ray"]) \
        == requirement_lines(ROOT / "requirements.txt")
    assert requirement_lines(ROOT / "requirements-test.txt") - set(project["optional-dependencies"]["test"]) \
        <= set(project["dependencies"])


def test_both_readme_installs_take_every_version_from_the_constraints_and_pip_install_keeps_ranges():
    # A new torch (2.15, with triton 3.9) once broke a green suite on a fresh machine: the README's commands and CI
    # install the versions the suite last passed with; pyproject.toml keeps the ranges for `pip install .`.
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    assert "-c constraints.txt" in (ROOT / "requirements.txt").read_text().splitlines()[0]
    assert any(line.startswith("-c constraints.txt") for line in
               (ROOT / "requirements-test-nodeps.txt").read_text().splitlines())
    pinned = pins(ROOT / "constraints.txt")
    for file in ("requirements.txt", "requirements-test.txt", "requirements-test-nodeps.txt"):
        for line in requirement_lines(ROOT / file):
            requirement = Requirement(line)
            name = canonicalize_name(requirement.name)
            assert name in pinned, f"{file}: {requirement.name} has no pin in constraints.txt"
            assert requirement.specifier.contains(pinned[name], prereleases=True), \
                f"{file}: {line} does not admit the pinned {pinned[name]}"
    assert all("==" not in d for d in PYPROJECT["project"]["dependencies"])


def installed_with(path: Path) -> set[str]:
    """The distributions ``pip install -r path`` brings in, by canonical name: its lines and, through the installed
    metadata, what they require (with the extras asked and the markers that hold here), all the way down."""
    import importlib.metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen, todo = set(), [Requirement(line) for line in requirement_lines(path)]
    while todo:
        requirement = todo.pop()
        key = (canonicalize_name(requirement.name), frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = importlib.metadata.distribution(requirement.name).requires or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for line in requires:
            needed = Requirement(line)
            if needed.marker is None or any(needed.marker.evaluate({"extra": e}) for e in requirement.extras or {""}):
                todo.append(needed)
    return {name for name, _ in seen}


# Every listed method on a tiny classifier, in a Python where the modules of the distributions given are not there
# (the path finder does not find them, as if never installed): what failed because an import did, and the
# self-check that a blocked module (pytest's) is indeed missing.
EVERY_METHOD_WITHOUT = """
import importlib.machinery, json, sys

blocked = set(sys.argv[1].split(","))


class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in blocked:
            return None
        return importlib.machinery.PathFinder.find_spec(name, path, target)

    def invalidate_caches(self):
        importlib.machinery.PathFinder.invalidate_caches()


sys.meta_path[:] = [Absent() if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
import numpy as np
import torch
from PIL import Image

import vit
from vit.checkpoint import Checkpoint, Preprocessing
from vit.model import ViT, ViTConfig

config = ViTConfig(image_size=16, patch_size=4, num_classes=3, hidden_size=16, num_layers=2, num_heads=2, mlp_size=32)
torch.manual_seed(0)
tiny = Checkpoint(model=ViT(config).eval(), class_names=["cat", "dog", "fox"],
                  preprocessing=Preprocessing.default_for(config))
photo = Image.fromarray(np.random.default_rng(3).integers(0, 256, (16, 16, 3), dtype=np.uint8))
failed = {}
for method in vit.methods():
    try:
        vit.explain(tiny, photo, method)
    except Exception as e:  # one that does not apply to this model says so (tests/test_api.py); an import is ours
        cause = e
        while cause is not None and not isinstance(cause, ImportError):
            cause = cause.__cause__ or cause.__context__
        if cause is not None:
            failed[method] = f"{type(e).__name__}: {e} (import {cause.name})"
try:
    import pytest
    blocked_works = False
except ImportError:
    blocked_works = True
print(json.dumps({"failed": failed, "blocked_works": blocked_works, "methods": len(vit.methods())}))
"""


@pytest.mark.slow
def test_every_listed_method_runs_with_requirements_txts_install_alone():
    """Issue 90, item 4: a method the app lists works with the README's app install: KernelSHAP needs captum's
    optional scikit-learn (captum's KernelShap fits its surrogate with it), which only the tests had installed, so
    users saw captum's raw "sklearn is not available". Every method runs with the modules of the distributions
    requirements.txt does not bring in made absent."""
    import importlib.metadata

    from packaging.utils import canonicalize_name

    allowed = installed_with(ROOT / "requirements.txt") | {"pip", "setuptools", "wheel"}  # a venv's own
    assert "scikit-learn" in allowed  # KernelSHAP's, named: the general check below is what finds the next one
    blocked = sorted(top for top, dists in importlib.metadata.packages_distributions().items()
                     if top.isidentifier() and top != "vit"
                     and not any(canonicalize_name(d) in allowed for d in dists))
    run = subprocess.run([sys.executable, "-c", EVERY_METHOD_WITHOUT, ",".join(blocked)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found["blocked_works"] and found["methods"] > 20
    assert found["failed"] == {}, found["failed"]


def test_the_readmes_cpu_wheels_are_the_pinned_versions():
    import re

    pinned = pins(ROOT / "constraints.txt")
    readme = (ROOT / "README.md").read_text()
    [line] = [line for line in readme.splitlines() if "--index-url https://download.pytorch.org/whl/cpu" in line]
    assert dict(re.findall(r"(torch|torchvision)==(\S+)", line)) == \
        {"torch": pinned["torch"], "torchvision": pinned["torchvision"]}


def test_vit_version_is_pyprojects_and_every_command_prints_it_with_version(capsys):
    import importlib

    import vit
    from vit.training.options import build_parser as train_parser

    version = PYPROJECT["project"]["version"]
    assert vit.__version__ == version
    parsers = {c: importlib.import_module(f"vit.{c}").build_parser for c in COMMANDS if c != "train"}
    for command, build in {**parsers, "train": train_parser}.items():
        with pytest.raises(SystemExit) as exit_:
            build().parse_args(["--version"])
        assert exit_.value.code == 0 and capsys.readouterr().out.split()[-1] == version, command
    assert explorer.main(["--version"]) == 0
    assert capsys.readouterr().out == f"vit-explorer {version}\n"


def test_every_package_of_vit_is_installed():
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "vit").rglob("__init__.py")}
    assert found <= set(PYPROJECT["tool"]["setuptools"]["packages"])


def test_every_command_has_a_console_script():
    scripts = PYPROJECT["project"]["scripts"]
    assert set(scripts) == {"vit-explorer", *(f"vit-{c.replace('_', '-')}" for c in COMMANDS)}
    for name, target in scripts.items():
        module, function = target.split(":")
        assert callable(getattr(__import__(module, fromlist=[function]), function)), name


def test_the_server_defaults_are_valid_toml_without_the_gc_after_every_run():
    """Streamlit reads .streamlit/config.toml with a TOML parser: a table written twice (two branches each added
    [runner]) would be a file it cannot read. postScriptGC off: a full gc.collect after every run holds the GIL for
    up to a second with torch loaded, stalling every other session (issues 33 and 35)."""
    config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert config["runner"]["postScriptGC"] is False
    assert config["server"]["address"] == "localhost" and config["client"]["showErrorDetails"] == "none"


def test_vit_explorer_runs_the_app_with_its_server_defaults_unless_overridden():
    args = explorer.streamlit_args(["--server.address", "0.0.0.0", "--server.port=8600"], ROOT)
    assert args[:2] == ["run", str(ROOT / "app.py")]
    assert "--server.fileWatcherType=none" in args and "--client.showErrorDetails=none" in args
    assert not any(a.startswith("--server.address=") for a in args)  # the user's address, not the default
    assert args[-3:] == ["--server.address", "0.0.0.0", "--server.port=8600"]


def copy_of_the_source(to: Path) -> Path:
    """The checkout's files without its own working folders: packages are built from a copy, which leaves nothing
    in the repository."""
    local = {".git", ".venv", "runs", "data", "build", "dist", "site", "test-artifacts", "analysis", ".pytest_cache",
             ".ruff_cache"}  # this checkout's own folders, at its top level only (vit/runs is a package)
    shutil.copytree(ROOT, to, ignore=lambda folder, names: [
        n for n in names if (Path(folder) == ROOT and n in local) or n == "__pycache__" or n.endswith(".egg-info")])
    return to


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_python_m_build_gives_a_wheel_and_an_sdist_that_twine_check_passes(tmp_path):
    import importlib.util

    if importlib.util.find_spec("build") is None or importlib.util.find_spec("twine") is None:
        pytest.skip("build and twine are not installed (requirements-docs.txt); .ci/run installs them")
    source = copy_of_the_source(tmp_path / "source")
    dist = tmp_path / "dist"
    # --no-isolation: the venv's setuptools builds it, with no download
    done = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel", "--outdir",
                           str(dist), str(source)], capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    version = PYPROJECT["project"]["version"]
    assert sorted(p.name for p in dist.iterdir()) == [f"vit_attention_explorer-{version}-py3-none-any.whl",
                                                      f"vit_attention_explorer-{version}.tar.gz"]
    done = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *map(str, dist.iterdir())],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.count("PASSED") == 2, done.stdout + done.stderr


@pytest.mark.slow
def test_the_wheel_installs_and_runs_from_another_folder(tmp_path):
    source = copy_of_the_source(tmp_path / "source")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "dist"), str(source)], check=True, capture_output=True)
    [wheel] = (tmp_path / "dist").glob("*.whl")
    env_dir = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # The dependencies are this environment's (torch, streamlit, ...): seen through a .pth, never downloaded.
    (site / "shared-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
                   check=True, capture_output=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1"}

    def run(*command: str) -> subprocess.CompletedProcess:
        return subprocess.run(command, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)

    bin_dir = env_dir / "bin"
    done = run(str(bin_dir / "vit-explorer"), "--help")
    assert done.returncode == 0 and "streamlit run" in done.stdout, done.stderr
    version = PYPROJECT["project"]["version"]
    done = run(str(bin_dir / "vit-explorer"), "--version")
    assert (done.returncode, done.stdout) == (0, f"vit-explorer {version}\n"), done.stderr
    done = run(str(bin_dir / "vit-predict"), "--help")
    assert done.returncode == 0 and done.stdout.startswith("usage: vit-predict") and "--save-maps" in done.stdout
    # the installed metadata's version (no pyproject.toml beside an installed vit), the README's first notebook
    # lines, and vit and its shipped model read from the installed package; then the installed app's first page in
    # Streamlit's AppTest (one torch start-up for the four, not three: issue 112)
    done = run(str(python), "-c", "import vit; checkpoint = vit.load(vit.shipped()); "
               "print(vit.__version__, list(vit.methods(checkpoint))[0]); "
               "print(vit.__file__, len(checkpoint.class_names)); "
               "from streamlit.testing.v1 import AppTest; import vit.core.runfiles as r; "
               "at = AppTest.from_file(str(r.app_root() / 'app.py'), default_timeout=240).run(); "
               "print(len(at.exception), [s.label for s in at.sidebar.selectbox][:1], at.title[0].value)")
    assert done.returncode == 0, done.stderr
    shown, installed, page = done.stdout.splitlines()[:3]
    assert shown == f"{version} attention", done.stdout
    where, classes = installed.split()
    assert Path(where).is_relative_to(site) and classes == "10"
    assert page == "0 ['Checkpoint'] ViT Attention Explorer", done.stdout

    shipped = site / "vit_explorer" / "checkpoints"
    done = run(str(bin_dir / "vit-predict"), str(shipped / "cifar10-cifar-s.pt"),
               str(shipped / "samples" / "cifar10-cifar-s" / "cat_1.png"), "--device", "cpu")
    assert done.returncode == 0, done.stderr
    from vit.predict import main as predict  # the checkout's, in this process: no third torch start-up

    checkout = io.StringIO()
    with contextlib.redirect_stdout(checkout):
        assert predict([str(ROOT / "checkpoints" / "cifar10-cifar-s.pt"), str(ROOT / "checkpoints" / "samples" /
                        "cifar10-cifar-s" / "cat_1.png"), "--device", "cpu"]) == 0
    assert json.loads(done.stdout)[0]["predictions"] == json.loads(checkout.getvalue())[0]["predictions"]

    port = free_port()
    server = subprocess.Popen([str(bin_dir / "vit-explorer"), "--server.port", str(port), "--server.headless",
                               "true"], cwd=elsewhere, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        wait_for_health(f"http://127.0.0.1:{port}", server, timeout=180)  # on localhost: the app's default address
    finally:
        server.terminate()
        server.wait(timeout=30)
