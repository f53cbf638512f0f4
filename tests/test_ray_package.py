"""What a Ray job uploads, as Ray itself packs it: the allow-listed ``vit`` package, never a secret beside it."""

import zipfile
from pathlib import Path

import pytest

from vit.runs import ray_jobs


def ray_zip(runtime_env: dict, scratch: Path) -> list[str]:
    """The names in the package Ray's own client code builds for ``runtime_env``'s working_dir (the same calls
    ``JobSubmissionClient.submit_job`` makes, with the upload to the cluster replaced by writing the zip)."""
    from ray._private.runtime_env.packaging import create_package
    from ray._private.runtime_env.working_dir import upload_working_dir_if_needed

    target = scratch / "package.zip"

    def write(working_dir: str, excludes=None, is_file: bool = False) -> None:
        create_package(working_dir, target, include_gitignore=True, excludes=excludes)

    upload_working_dir_if_needed(dict(runtime_env), include_gitignore=True, upload_fn=write)
    with zipfile.ZipFile(target) as package:
        return sorted(name for name in package.namelist() if not name.endswith("/"))


def test_a_job_uploads_the_vit_package_and_no_secret_of_the_checkout(tmp_path):
    """Issue 39, item 2: the token in .streamlit/secrets.toml reached the node inside the job's working_dir."""
    checkout = tmp_path / "checkout"
    (checkout / "vit" / "runs" / "__pycache__").mkdir(parents=True)
    for name in ("vit/__init__.py", "vit/model.py", "vit/runs/__init__.py", "vit/runs/ray_train.py"):
        (checkout / name).write_text("# code\n")
    secrets = {".streamlit/secrets.toml": 'train_token = "correct-horse-battery-staple"\n', ".env": "TOKEN=x\n",
               "notes.txt": "private\n", "data/cat/0.png": "png", "vit/.env": "TOKEN=x\n",
               "vit/runs/__pycache__/ray_train.cpython-311.pyc": "bytecode", "vit/weights.pt": "weights",
               "elsewhere/leak.py": "secret = 1\n"}
    for name, text in secrets.items():
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).write_text(text)
    (checkout / "vit" / "linked.py").symlink_to(checkout / "elsewhere" / "leak.py")  # a link out of the package
    with ray_jobs.code_package(checkout) as env:
        names = ray_zip(env, tmp_path)
    assert names == ["vit/__init__.py", "vit/model.py", "vit/runs/__init__.py", "vit/runs/ray_train.py"]


def test_the_real_package_holds_the_jobs_entrypoints_and_only_python_files(tmp_path):
    with ray_jobs.code_package() as env:
        names = ray_zip(env, tmp_path)
    assert {"vit/runs/ray_train.py", "vit/analyze.py", "vit/runs/ray_analyze.py"} <= set(names)
    assert all(name.startswith("vit/") and name.endswith(".py") and "__pycache__" not in name for name in names)


def test_a_package_over_the_limit_is_refused_before_the_cluster_is_contacted(tmp_path):
    (tmp_path / "vit").mkdir()
    (tmp_path / "vit" / "big.py").write_text("#" * 2000)
    with pytest.raises(ray_jobs.RayRunError, match="over the 0 MB limit"), ray_jobs.code_package(tmp_path, 1000):
        pass
