"""SAE training as a run: the run files the Train page reads, a SIGTERM that stops it cleanly after a step, and a
resume that continues at that step and ends with exactly the weights of a run that was never stopped."""

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vit.core.runfiles import read_config, read_metrics, read_status
from vit.features import autoencoder_training as sae_train
from vit.sae import main

ROOT = Path(__file__).resolve().parent.parent
CHECKPOINT = ROOT / "checkpoints" / "cifar10-cifar-s.pt"
SAMPLES = ROOT / "checkpoints" / "samples" / "cifar10-cifar-s"
# 10 sample images: 8 train (520 tokens, 9 steps of 64 per epoch), 2 held out.
TINY = ["--layer", "2", "--width", "48", "--k", "4", "--epochs", "3", "--batch-size", "64", "--buffer-tokens", "256",
        "--holdout", "2", "--device", "cpu"]


def train(out: Path, *extra: str) -> int:
    return main(["train", str(CHECKPOINT), "--data", str(SAMPLES), *TINY, "--out", str(out), *extra])


def sigterm_at_step(monkeypatch, step: int) -> None:
    """A SIGTERM delivered to this process while step ``step`` trains, as the page's Stop sends it."""
    original = sae_train.SAETraining._train_step

    def step_then_signal(self, x, on_step):
        original(self, x, on_step)
        if self.step == step:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(sae_train.SAETraining, "_train_step", step_then_signal)


def test_a_run_writes_the_run_files_the_train_page_reads(tmp_path):
    out = tmp_path / "sae"
    assert train(out) == 0
    status, config = read_status(out / "status.json"), read_config(out / "config.json")
    assert status["state"] == "completed" and status["step"] == status["total_steps"] == 27
    assert config["kind"] == "sae" and config["args"]["epochs"] == 3
    steps = read_metrics(out / "steps.jsonl")
    assert [row["step"] for row in steps] == list(range(1, 28))  # a short run keeps every step
    assert {"explained_variance", "l0", "dead_fraction"} <= set(steps[-1])
    assert (out / "last.pt").is_file() and (out / "cfg.json").is_file()


def test_sigterm_stops_after_the_step_and_saves_where_it_stood(tmp_path, monkeypatch, capsys):
    out = tmp_path / "sae"
    sigterm_at_step(monkeypatch, 10)
    assert train(out) == 0
    assert read_status(out / "status.json")["state"] == "cancelled"
    assert torch.load(out / "last.pt", weights_only=True)["state"]["step"] == 10
    assert not (out / "cfg.json").exists()  # no SAE folder from a stopped run
    assert "--resume" in capsys.readouterr().err


def test_a_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(tmp_path, monkeypatch):
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    assert train(whole) == 0
    with monkeypatch.context() as m:
        sigterm_at_step(m, 12)  # mid-epoch 2: the resume skips the 3 batches of it already trained on
        assert train(stopped) == 0
    assert main(["train", "--resume", str(stopped)]) == 0
    assert read_status(stopped / "status.json")["state"] == "completed"
    a, b = load_file(whole / "sae_weights.safetensors"), load_file(stopped / "sae_weights.safetensors")
    assert all(torch.equal(a[name], b[name]) for name in a)
    strip = [{k: v for k, v in row.items() if k != "seconds"} for row in read_metrics(whole / "steps.jsonl")]
    assert [{k: v for k, v in row.items() if k != "seconds"} for row in read_metrics(stopped / "steps.jsonl")] == strip
    assert json.loads((whole / "metrics.json").read_text())["explained_variance"] == \
        json.loads((stopped / "metrics.json").read_text())["explained_variance"]
    assert len(read_config(stopped / "config.json")["resumes"]) == 1


@pytest.mark.parametrize("make, message", [
    (lambda out: out.mkdir(), "not an SAE run folder"),
    (lambda out: None, "not an SAE run folder"),
])
def test_resume_of_a_folder_that_is_no_sae_run_is_one_line(tmp_path, capsys, make, message):
    make(tmp_path / "x")
    assert main(["train", "--resume", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_new_run_refuses_a_folder_holding_a_run(tmp_path, capsys, monkeypatch):
    sigterm_at_step(monkeypatch, 2)
    assert train(tmp_path / "sae") == 0
    capsys.readouterr()
    assert train(tmp_path / "sae") == 2
    assert "--resume" in capsys.readouterr().err


def test_a_harvest_from_elsewhere_in_blocks_of_any_size_trains_the_local_sae(tmp_path):
    """What ``--ray`` changes, without a cluster: the tokens come from ``Harvester`` (the Ray Data actor's code)
    in blocks of 3 images, not from the local loop in batches of 64; the SAE is the same."""
    from vit.runs.ray_sae import Harvester

    def harvest(model, arch, hook, files, image_batch):
        actor = Harvester(model, arch, hook, "cpu")
        for start in range(0, len(files), 3):
            batch = {"index": list(range(start, min(start + 3, len(files)))),
                     "path": [str(p) for p in files[start:start + 3]]}
            yield torch.from_numpy(actor(batch)["tokens"])

    from vit.sae import build_parser, run

    assert train(tmp_path / "local") == 0
    args = build_parser().parse_args(["train", str(CHECKPOINT), "--data", str(SAMPLES), *TINY,
                                      "--out", str(tmp_path / "elsewhere")])
    assert run(args, harvest=harvest) == 0
    a = load_file(tmp_path / "local" / "sae_weights.safetensors")
    b = load_file(tmp_path / "elsewhere" / "sae_weights.safetensors")
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_the_harvesting_actor_returns_the_layers_tokens_of_the_local_harvest():
    from vit.checkpoint import load_checkpoint
    from vit.features.harvest import image_batches, image_files, layer_tokens
    from vit.runs.ray_sae import Harvester

    files = image_files(SAMPLES)[:4]
    checkpoint = load_checkpoint(CHECKPOINT)
    local = layer_tokens(checkpoint.model.eval(), next(image_batches(checkpoint, files, 4, torch.device("cpu"))),
                         "blocks.1.hook_resid_post")
    out = Harvester(str(CHECKPOINT), None, "blocks.1.hook_resid_post", "cpu")(
        {"index": [0, 1, 2, 3], "path": [str(p) for p in files]})
    assert out["index"].tolist() == [0, 1, 2, 3]
    torch.testing.assert_close(torch.from_numpy(out["tokens"]), local, rtol=0, atol=0)


@pytest.mark.parametrize("resources, workers, expected", [
    ({"CPU": 2.0}, 1, (False, {"CPU": 1}, {"num_cpus": 1})),
    ({"CPU": 16.0, "GPU": 1.0}, 3, (True, {"CPU": 0, "GPU": 0.25}, {"num_cpus": 0, "num_gpus": 0.25})),
])
def test_the_ray_plan_puts_the_trainer_on_a_gpu_when_the_cluster_has_one(resources, workers, expected):
    from vit.runs.ray_sae import plan

    assert plan(resources, workers) == expected


def test_a_cluster_too_small_for_the_workers_is_refused_in_one_line():
    from vit.runs.ray_jobs import RayRunError
    from vit.runs.ray_sae import plan

    with pytest.raises(RayRunError, match="--workers 3 needs 4 CPUs"):
        plan({"CPU": 2.0}, 3)


def test_the_page_starts_sae_runs_with_vit_sae_on_the_device_it_was_given(monkeypatch, tmp_path):
    from vit.runs.launch import RAY, SAEParams, sae_cli_args, sae_command

    params = SAEParams(name="s", model="m.pt", data="images", layer=3, k=8, width=512, epochs=2)
    argv = sae_cli_args(params, tmp_path / "s")
    assert argv[:2] == ["train", str(ROOT / "m.pt")] and argv[argv.index("--width") + 1] == "512"
    assert "--expansion" not in argv and argv[argv.index("--out") + 1] == str(tmp_path / "s")
    command, env = sae_command(argv, ("cpu",))
    assert command[1:3] == ["-m", "vit.sae"] and command[-2:] == ["--device", "cpu"] and env == {}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    command, env = sae_command(argv, ("cuda:1",))
    assert command[-2:] == ["--device", "cuda"] and env == {"CUDA_VISIBLE_DEVICES": "5"}
    monkeypatch.setenv("VIT_RAY_ADDRESS", "http://127.0.0.1:8265")
    command, env = sae_command(argv, RAY, workers=2)
    assert command[-4:] == ["--ray", "http://127.0.0.1:8265", "--workers", "2"]


def test_a_sigterm_while_the_buffer_fills_stops_before_the_next_step_and_resumes_exactly(tmp_path, monkeypatch):
    from vit.features import harvest as harvesting

    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    assert train(whole, "--image-batch", "2") == 0
    original, calls = harvesting.layer_tokens, []

    def forward_then_signal(model, images, hook):
        calls.append(1)
        if len(calls) == 1:  # the first of the two forwards the first step needs
            os.kill(os.getpid(), signal.SIGTERM)
        return original(model, images, hook)

    with monkeypatch.context() as m:
        m.setattr(harvesting, "layer_tokens", forward_then_signal)
        assert train(stopped, "--image-batch", "2") == 0
    assert len(calls) == 1 and read_status(stopped / "status.json")["state"] == "cancelled"
    assert torch.load(stopped / "last.pt", weights_only=True)["state"]["step"] == 0
    assert main(["train", "--resume", str(stopped)]) == 0
    a, b = load_file(whole / "sae_weights.safetensors"), load_file(stopped / "sae_weights.safetensors")
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_a_resume_of_a_run_folder_with_an_argument_of_the_wrong_type_is_one_line(tmp_path, capsys, monkeypatch):
    sigterm_at_step(monkeypatch, 2)
    assert train(tmp_path / "sae") == 0
    config = json.loads((tmp_path / "sae" / "config.json").read_text())
    config["args"]["layer"] = "2; rm -rf /"
    (tmp_path / "sae" / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path / "sae")]) == 2
    err = capsys.readouterr().err
    assert "'layer' is" in err and err.count("\n") == 1


def test_an_unreachable_ray_address_is_one_line_and_writes_nothing(tmp_path, capsys):
    from helpers import free_port

    code = main(["train", str(CHECKPOINT), "--data", str(SAMPLES), *TINY, "--out", str(tmp_path / "o"),
                 "--ray", f"http://127.0.0.1:{free_port()}", "--workers", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("vit.sae: error: cannot read the Ray cluster's resources") and \
        err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_workers_without_ray_are_refused(tmp_path, capsys):
    assert train(tmp_path / "o", "--workers", "2") == 2
    assert "--workers needs --ray ADDRESS" in capsys.readouterr().err


def test_a_resume_right_after_a_sigkill_is_not_refused_for_the_dead_pid_s_fresh_heartbeat(tmp_path, monkeypatch):
    import socket
    import subprocess

    from vit.core.runfiles import now_iso

    sigterm_at_step(monkeypatch, 2)
    assert train(tmp_path / "sae") == 0
    monkeypatch.undo()
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid of this host whose process has ended, as a SIGKILLed run's
    status = json.loads((tmp_path / "sae" / "status.json").read_text())
    status.update(state="running", pid=gone.pid, host=socket.gethostname(), updated_time=now_iso())
    (tmp_path / "sae" / "status.json").write_text(json.dumps(status))
    assert main(["train", "--resume", str(tmp_path / "sae")]) == 0
    assert read_status(tmp_path / "sae" / "status.json")["state"] == "completed"


def test_a_resume_of_a_run_whose_process_still_beats_names_it(tmp_path, monkeypatch, capsys):
    import socket

    from vit.core.runfiles import now_iso

    sigterm_at_step(monkeypatch, 2)
    assert train(tmp_path / "sae") == 0
    status = json.loads((tmp_path / "sae" / "status.json").read_text())
    status.update(state="running", pid=os.getpid(), host=socket.gethostname(), updated_time=now_iso())
    (tmp_path / "sae" / "status.json").write_text(json.dumps(status))
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path / "sae")]) == 2
    err = capsys.readouterr().err
    assert f"the run is still running (pid {os.getpid()} on {socket.gethostname()}" in err and err.count("\n") == 1


def test_an_unfinished_run_opened_as_an_sae_says_it_has_not_finished(tmp_path, monkeypatch):
    from vit.features.autoencoder import SAEError
    from vit.features.formats import open_sae

    sigterm_at_step(monkeypatch, 2)
    assert train(tmp_path / "sae") == 0
    with pytest.raises(SAEError, match=r"is an SAE run that has not finished \(no cfg\.json yet\): wait for it to "
                                       r"end, or continue it with python -m vit\.sae train --resume "):
        open_sae(tmp_path / "sae")


def test_an_image_added_to_the_folder_before_a_resume_is_not_read_by_it(tmp_path, monkeypatch):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(SAMPLES, data)
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    assert main(["train", str(CHECKPOINT), "--data", str(data), *TINY, "--out", str(whole)]) == 0
    with monkeypatch.context() as m:
        sigterm_at_step(m, 12)
        assert main(["train", str(CHECKPOINT), "--data", str(data), *TINY, "--out", str(stopped)]) == 0
    for name in ("aa_broken.png", "zz_broken.jpg"):  # would sort and shuffle in among the run's own images
        (data / name).write_bytes(b"not an image")
    assert main(["train", "--resume", str(stopped)]) == 0
    a, b = load_file(whole / "sae_weights.safetensors"), load_file(stopped / "sae_weights.safetensors")
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_a_resume_whose_list_of_images_leads_out_of_the_data_folder_is_one_line(tmp_path, monkeypatch, capsys):
    sigterm_at_step(monkeypatch, 2)
    assert train(tmp_path / "sae") == 0
    files = json.loads((tmp_path / "sae" / "files.json").read_text())
    files["train"][0] = "../../etc/passwd"
    (tmp_path / "sae" / "files.json").write_text(json.dumps(files))
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path / "sae")]) == 2
    err = capsys.readouterr().err
    assert "files.json names '../../etc/passwd', which is not a file under" in err and err.count("\n") == 1


KILL_AT_STEP = """
import os, signal, sys
from vit.features import autoencoder_training as sae_train
from vit.sae import main

original, at = sae_train.SAETraining._train_step, int(sys.argv[1])

def step_then_die(self, x, on_step):
    original(self, x, on_step)
    if self.step == at:
        os.kill(os.getpid(), signal.SIGKILL)

sae_train.SAETraining._train_step = step_then_die
sys.exit(main(sys.argv[2:]))
"""


def killed_at_step(step: int, *argv: str) -> int:
    """``vit.sae`` in its own process (forked from the measuring server, which imported torch once), SIGKILLed right
    after step ``step``: what survives is what it saved."""
    from peak_memory import run_forked

    return run_forked(KILL_AT_STEP, [str(step), *argv], timeout=240).returncode


def saved_step(out: Path) -> int:
    return torch.load(out / "last.pt", weights_only=True)["state"]["step"]


def test_a_resumed_run_keeps_its_checkpoint_interval_so_a_kill_after_the_resume_loses_nothing(tmp_path, monkeypatch):
    """Issue 62, item 5: ``--resume OUT`` took --checkpoint-seconds' default (60 s), not the run's, so a kill after
    a resume lost every step since it; the run's options are config.json's, a resume's own flag a new value."""
    out = tmp_path / "sae"
    with monkeypatch.context() as m:
        sigterm_at_step(m, 2)
        assert train(out, "--checkpoint-seconds", "0") == 0  # last.pt after every step
    assert saved_step(out) == 2
    assert killed_at_step(14, "train", "--resume", str(out)) == -signal.SIGKILL
    assert saved_step(out) == 14  # 60 s would have kept step 2
    assert read_config(out / "config.json")["args"]["checkpoint_seconds"] == 0
    # A resume that gives the flag sets the run's interval for the resumes after it.
    assert killed_at_step(16, "train", "--resume", str(out), "--checkpoint-seconds", "3600") == -signal.SIGKILL
    assert saved_step(out) == 14
    assert read_config(out / "config.json")["args"]["checkpoint_seconds"] == 3600
    assert main(["train", "--resume", str(out)]) == 0
    assert read_status(out / "status.json")["state"] == "completed"
