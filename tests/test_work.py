"""Long work that can be stopped (vit.app.work): the grids, means, flow and curves report their passes between
chunks through a callback, stop at the next chunk once asked (or once their page is gone), give the same numbers
as a run without the callback, and no more than ``Slots.size`` of them run at once."""

import threading
import time

import numpy as np
import pytest
import torch
from test_mechanism import CONFIG, images, random_vit

from vit.app import work
from vit.core.progress import in_parts
from vit.explain.mechanism.components import ablation_grid, patch_heads, patch_residuals
from vit.explain.methods.attention_flow import attention_flow


class Recorder:
    """A progress callback that records every ``(done, total)`` and asks a Work to stop after ``stop_after``."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.calls: list[tuple[int, int]] = []
        self.stop_after = stop_after
        self.passes: list = []  # counting_passes's list, if the test counts them
        self.passes_seen: list[int] = []  # how many had run at each report
        self.work = work.Work("key", "test")

    def __call__(self, done: int, total: int) -> None:
        self.calls.append((done, total))
        self.passes_seen.append(len(self.passes))
        if self.stop_after is not None and len(self.calls) > self.stop_after:
            self.work.stop("stopped by the test")
        self.work(done, total)


def counting_passes(model):
    """Wrap ``model.run_blocks``: the list it returns grows by one per pass of the remaining layers."""
    passes, run_blocks = [], model.run_blocks

    def counted(*args, **kwargs):
        passes.append(1)
        return run_blocks(*args, **kwargs)

    model.run_blocks = counted
    return passes


def test_the_ablation_grid_reports_each_layer_and_gives_the_same_grid():
    model, x = random_vit(), images(2)
    recorder = Recorder()
    with torch.no_grad():
        expected = ablation_grid(model, x)
        got = ablation_grid(model, x, progress=recorder)
    L, cells = CONFIG.num_layers, 2 * CONFIG.num_heads  # a layer's interventions: every head of every image
    assert recorder.calls == [(i * cells, L * cells) for i in range(L + 1)]
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_a_stopped_grid_stops_at_the_next_chunk():
    model, x = random_vit(), images(1)
    passes = counting_passes(model)
    recorder = Recorder(stop_after=1)  # the report after the first layer asks to stop
    recorder.passes = passes
    with pytest.raises(work.Stopped, match="stopped by the test"):
        ablation_grid(model, x, progress=recorder)
    assert recorder.calls[-1] == (CONFIG.num_heads, CONFIG.num_layers * CONFIG.num_heads)
    first, stop = recorder.passes_seen
    assert stop - first == 1 and len(passes) == stop  # one layer's pass ran, none after the stop


def test_head_patching_reports_each_layer_and_gives_the_same_grid():
    model, clean, corrupted = random_vit(), images(2, seed=1), images(2, seed=2)
    recorder = Recorder()
    expected = patch_heads(model, clean, corrupted)
    got = patch_heads(model, clean, corrupted, progress=recorder)
    L, cells = CONFIG.num_layers, 2 * CONFIG.num_heads
    assert recorder.calls == [(i * cells, L * cells) for i in range(L + 1)]
    torch.testing.assert_close(got.patched, expected.patched, rtol=0, atol=0)


def test_residual_patching_counts_every_position_and_stops_within_one_chunk(monkeypatch):
    from vit.explain.mechanism import interventions as mechanism  # where the grids batch their copies

    monkeypatch.setattr(mechanism, "_chunks", lambda total, per_copy: 5)  # 17 tokens: chunks of 5, 5, 5, 2
    model, clean, corrupted = random_vit(), images(1, seed=1), images(1, seed=2)
    T, L = 1 + 16, CONFIG.num_layers
    recorder = Recorder()
    expected = patch_residuals(model, clean, corrupted)
    got = patch_residuals(model, clean, corrupted, progress=recorder)
    torch.testing.assert_close(got.patched, expected.patched, rtol=0, atol=0)
    assert recorder.calls[0] == (0, L * T) and recorder.calls[-1] == (L * T, L * T)
    assert [d for d, _ in recorder.calls[1:5]] == [5, 10, 15, 17]  # the first layer's four chunks
    passes = counting_passes(model)
    recorder = Recorder(stop_after=2)
    recorder.passes = passes
    with pytest.raises(work.Stopped):
        patch_residuals(model, clean, corrupted, progress=recorder)
    first, _, stop = recorder.passes_seen
    assert stop - first == 2 and len(passes) == stop  # two chunks ran, none after the stop


def test_attention_flow_reports_each_max_flow_problem():
    torch.manual_seed(0)
    attentions = [torch.rand(1, 2, 5, 5).softmax(-1) for _ in range(2)]
    recorder = Recorder()
    got = attention_flow(attentions, progress=recorder)
    assert recorder.calls == [(i, 5) for i in range(6)]
    torch.testing.assert_close(got, attention_flow(attentions), rtol=0, atol=0)
    with pytest.raises(work.Stopped):
        attention_flow(attentions, progress=Recorder(stop_after=2))


def test_in_parts_counts_the_parts_as_one_whole():
    calls = []
    first, second = in_parts(lambda d, t: calls.append((d, t)), [3, 10])
    first(3, 3)
    second(4, 10)
    assert calls == [(3, 13), (7, 13)]
    assert in_parts(None, [3, 10]) == [None, None]


class FakeClock:
    """A clock that moves only when the test says so: no sleeps, the same result on a loaded machine."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_work_started_in_a_thread_gives_its_result_and_its_progress():
    def compute(progress):
        for i in range(4):
            progress(i, 4)
        progress(4, 4)
        return "result"

    job = work.Work("k", "Test").start(compute)
    assert job.wait(10)
    assert (job.state, job.result, job.done, job.total) == ("done", "result", 4, 4)


def test_a_running_work_before_its_first_report_says_it_is_starting_not_0_of_0():
    reported, release = threading.Event(), threading.Event()
    job = work.Work("k", "Ablating each head in turn", unit="heads").start(lambda progress: release.wait(10))
    while job.state != "running":
        reported.wait(0.01)
    assert job.describe() == "Ablating each head in turn: starting…"
    job(3, 144)
    assert job.describe().startswith("Ablating each head in turn: 3 of 144 heads")
    release.set()
    assert job.wait(10)


def test_a_stop_from_another_thread_ends_the_work_at_its_next_chunk():
    started, passes = threading.Event(), []

    def compute(progress):
        for i in range(1000):
            progress(i, 1000)
            passes.append(i)
            started.set()
            time.sleep(0.01)

    job = work.Work("k", "Test").start(compute)
    assert started.wait(10)
    job.stop("stopped by you")
    done_when_stopped = job.done
    assert job.wait(10)
    assert job.state == "stopped" and "stopped by you" in str(job.error)
    assert len(passes) <= done_when_stopped + 2  # the chunk running at the stop, at most, finished


def test_a_work_nobody_looks_at_stops_after_its_lease():
    now = [0.0]
    job = work.Work("k", "Test", lease_s=10.0, clock=lambda: now[0])
    job(1, 10)
    now[0] = 9.0
    job.touch()
    now[0] = 18.0
    job(2, 10)  # touched 9 s ago: goes on
    now[0] = 19.5
    with pytest.raises(work.Stopped, match="no page showed it"):
        job(3, 10)


def test_a_work_whose_session_ended_stops():
    alive = [True]
    job = work.Work("k", "Test", alive=lambda: alive[0])
    job(1, 10)
    alive[0] = False
    with pytest.raises(work.Stopped, match="page was closed"):
        job(2, 10)


def test_the_time_left_is_the_rate_so_far_times_the_passes_left():
    now = [100.0]
    job = work.Work("k", "Grid", clock=lambda: now[0])
    job.state, job._started = "running", 100.0
    job(0, 12)
    assert job.seconds_left() is None
    now[0] = 130.0
    job.touch()
    job(3, 12)
    assert job.seconds_left() == pytest.approx(90.0)
    assert job.describe() == "Grid: 3 of 12 passes, about 1 min 30 s left"


def test_no_more_than_the_slots_run_at_once_and_the_others_say_they_wait():
    slots = work.Slots(1)
    release, running = threading.Event(), []

    def compute(progress):
        running.append(1)
        progress(0, 1)
        release.wait(10)
        return len(running)

    first = work.Work("a", "First", slots).start(compute)
    while first.state != "running":
        time.sleep(0.01)
    second = work.Work("b", "Second", slots).start(compute)
    time.sleep(0.3)
    assert second.state == "waiting" and running == [1]
    assert "waiting" in second.describe() and "1 heavy computation" in second.describe()
    release.set()
    assert first.wait(10) and second.wait(10)
    assert (first.result, second.result) == (1, 2)
    assert slots.running == 0 and slots.waiting == 0


def test_a_waiting_work_can_be_stopped_before_it_starts():
    slots = work.Slots(1)
    hold = threading.Event()
    first = work.Work("a", "First", slots).start(lambda progress: hold.wait(10))
    while first.state != "running":
        time.sleep(0.01)
    second = work.Work("b", "Second", slots).start(lambda progress: pytest.fail("ran after being stopped"))
    second.stop("stopped by you")
    assert second.wait(10) and second.state == "stopped"
    hold.set()
    assert first.wait(10)
    assert slots.running == 0


def test_reference_means_report_each_chunk_and_give_the_same_means(tmp_path):
    from test_app import png_bytes, write_checkpoint

    from vit.checkpoint import load_checkpoint
    from vit.core.images import open_image
    from vit.explain.views import mechanism_views

    checkpoint = load_checkpoint(write_checkpoint(tmp_path / "m.pt"))
    refs = [open_image(png_bytes(seed=s), name="x.png") for s in range(mechanism_views.REFERENCE_CHUNK + 2)]
    recorder = Recorder()
    got = mechanism_views.reference_means(checkpoint, refs, refs[0], progress=recorder, count=len(refs))
    assert recorder.calls == [(mechanism_views.REFERENCE_CHUNK, len(refs)), (len(refs), len(refs))]
    np.testing.assert_array_equal(got.numpy(), mechanism_views.reference_means(checkpoint, refs, refs[0]).numpy())


def test_deletion_insertion_curves_report_each_batch_and_give_the_same_curves():
    from vit.explain.benchmarks.metrics import perturbation_curves

    model, x = random_vit(), images(1)
    maps = torch.rand(1, 4, 4, generator=torch.Generator().manual_seed(0))
    classes = torch.tensor([2])
    recorder = Recorder()
    got = perturbation_curves(model, x, maps, classes, batch_size=5, progress=recorder)
    expected = perturbation_curves(model, x, maps, classes, batch_size=5)
    S = 17  # 0 .. 16 patches
    assert recorder.calls[0] == (0, 2 * S) and recorder.calls[-1] == (2 * S, 2 * S)
    assert [d for d, _ in recorder.calls[1:5]] == [5, 10, 15, 17]  # deletion's four batches
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(work.Stopped):
        perturbation_curves(model, x, maps, classes, batch_size=5, progress=Recorder(stop_after=2))


def test_a_template_ensemble_reports_each_step_of_texts_and_gives_the_same_embeddings():
    from vit.explain.language import prompts

    encoded = []

    def encode(texts):  # a deterministic embedding per text, normalised as TextTower.encode's
        encoded.append(len(texts))
        rows = [torch.randn(8, generator=torch.Generator().manual_seed(hash(t) % 2**31)) for t in texts]
        e = torch.stack(rows)
        return e / e.norm(dim=-1, keepdim=True)

    templates = prompts.imagenet_templates()
    recorder = Recorder()
    got = prompts.prompt_embeddings(encode, ["a cat", "a dog"], templates, progress=recorder)
    total = 2 * len(templates)
    assert max(encoded) == prompts.TEXTS_PER_STEP
    assert recorder.calls[0] == (0, total) and recorder.calls[-1] == (total, total)
    assert len(recorder.calls) == 1 + -(-total // prompts.TEXTS_PER_STEP)
    torch.testing.assert_close(got, prompts.prompt_embeddings(encode, ["a cat", "a dog"], templates), rtol=0, atol=0)
    with pytest.raises(work.Stopped):
        prompts.prompt_embeddings(encode, ["a cat"], templates, progress=Recorder(stop_after=1))


def test_the_explorers_forward_reports_each_layer_and_can_be_stopped(tmp_path):
    from test_app import png_bytes, write_checkpoint

    from vit.checkpoint import load_checkpoint
    from vit.core.images import open_image
    from vit.explain.views import image_analysis

    checkpoint = load_checkpoint(write_checkpoint(tmp_path / "m.pt"))
    image = open_image(png_bytes(seed=1), name="x.png")
    L = len(checkpoint.model.blocks)
    recorder = Recorder()
    got = image_analysis.analyse(checkpoint, image, progress=recorder)
    assert recorder.calls == [(i, L) for i in range(1, L + 1)]
    torch.testing.assert_close(got.hidden, image_analysis.analyse(checkpoint, image).hidden, rtol=0, atol=0)
    with pytest.raises(work.Stopped):
        image_analysis.analyse(checkpoint, image, progress=Recorder(stop_after=0))


def test_a_shared_work_asked_for_again_while_it_runs_is_the_same_one_run_once():
    shared, release, runs = work.Shared(2), threading.Event(), []

    def compute(progress):
        runs.append(1)
        release.wait(10)
        return "files"

    first = shared.start("model@abc", "Download", compute)
    again = shared.start("model@abc", "Download", compute)  # another page, or this page's rerun
    assert again is first and shared.get("model@abc") is first
    release.set()
    assert first.wait(10) and first.result == "files" and runs == [1]


def test_a_shared_work_that_ended_is_started_anew_when_asked_again():
    shared = work.Shared(1)
    failed = shared.start("k", "Download", lambda progress: 1 / 0)
    assert failed.wait(10) and failed.state == "failed"
    assert shared.get("k") is failed, "kept until a page has said how it ended"
    again = shared.start("k", "Download", lambda progress: "files")
    assert again is not failed and again.wait(10) and again.result == "files"
    shared.forget(failed)  # a page that saw the old one end forgets it: not the new one
    assert shared.get("k") is again
    shared.forget(again)
    assert shared.get("k") is None and shared.works() == []


def test_shared_works_that_ended_are_forgotten_once_no_page_showed_them_for_the_lease():
    clock = FakeClock()
    shared = work.Shared(2, lease_s=60.0, clock=clock)
    ended = shared.start("a", "Download", lambda progress: "a")
    assert ended.wait(10)
    clock.now = 59.0
    shared.start("b", "Download", lambda progress: "b").wait(10)
    assert shared.get("a") is ended, "a page may still come to say how it ended"
    clock.now = 61.0
    shared.start("c", "Download", lambda progress: "c").wait(10)
    assert shared.get("a") is None and shared.get("b") is not None and shared.get("c") is not None


def test_no_more_shared_works_run_at_once_than_its_size():
    shared, release = work.Shared(1), threading.Event()
    first = shared.start("a", "Download of a", lambda progress: release.wait(10))
    while first.state != "running":
        time.sleep(0.01)
    second = shared.start("b", "Download of b", lambda progress: "b")
    time.sleep(0.3)
    assert second.state == "waiting" and shared.slots.running == 1
    assert second.describe() == ("Download of b: waiting — 1 download run on this server, at most 1 at once; this one "
                                 "starts when one ends")
    release.set()
    assert second.wait(10) and second.result == "b"


def test_a_download_says_its_bytes_its_stop_and_its_end_as_a_computation_says_its_passes():
    """One ``describe`` for the pages' long computations and the Hub downloads: a download's amounts in bytes, and
    a stop asked for said until its next chunk (a download's line once showed the bytes as though none was)."""
    now = [100.0]
    job = work.Work("k", "Downloading acme/vit", clock=lambda: now[0], unit="bytes")
    job.state, job._started = "running", 100.0
    job(1_500_000, 6_000_000)
    now[0] = 103.0
    assert job.describe() == "Downloading acme/vit: 1.5 MB of 6.0 MB, about 9 s left"
    job.stop("stopped by a visitor")
    assert job.describe() == "Downloading acme/vit: stopping at the end of this chunk (stopped by a visitor)"
    with pytest.raises(work.Stopped):
        job(1_600_000, 6_000_000)
    job.error, job.state = job._raised, "stopped"
    assert job.describe() == "Downloading acme/vit: stopped after 1.6 MB of 6.0 MB (stopped by a visitor)"


def test_the_servers_downloads_at_once_come_from_its_environment(monkeypatch):
    from app_pages.explorer_sections import hub_download

    for given, expected in (("3", 3), ("", 2), ("0", 2), ("two", 2), ("-1", 2)):
        monkeypatch.setenv("VIT_DOWNLOADS_AT_ONCE", given)
        assert hub_download.at_once() == expected, given
