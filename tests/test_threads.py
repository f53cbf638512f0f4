"""torch's thread count from the cores free at start (``vit.core.threads``): the choice under a mocked load, the env
override, and a bad override as a command's one-line usage error."""

import pytest

from vit.core import threads


@pytest.mark.parametrize(("cores", "load", "expected"), [
    (2, 0.0, 2),  # idle: every core
    (2, 0.4, 2),  # less than half a core busy: still free
    (2, 1.0, 1),  # one of two cores busy (the case: two threads took 2.2x as long)
    (2, 0.6, 1),
    (2, 6.5, 1),  # oversubscribed: never fewer than one
    (8, 2.0, 6),
    (1, 0.0, 1),
])
def test_free_threads_are_the_cores_left_free(cores, load, expected):
    assert threads.free_threads(cores, load) == expected


def test_the_choice_reads_the_affinity_and_the_load(monkeypatch):
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (1.2, 3.0, 3.0))
    assert threads.chosen_threads({}) == 3  # 4 cores, about one busy (the one-minute average)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (0.1, 0.0, 0.0))
    assert threads.chosen_threads({}) == 4


def test_a_system_without_a_load_average_uses_every_usable_core(monkeypatch):
    def unsupported():
        raise OSError("no load average")

    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(threads.os, "getloadavg", unsupported)
    assert threads.chosen_threads({}) == 2


def test_vit_threads_overrides_the_choice(monkeypatch):
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (100.0, 100.0, 100.0))
    assert threads.chosen_threads({"VIT_THREADS": "3"}) == 3


@pytest.mark.parametrize("value", ["0", "two", "-1", "1.5"])
def test_a_vit_threads_that_is_not_a_count_is_refused(value):
    with pytest.raises(ValueError, match="VIT_THREADS must be a whole number of at least 1"):
        threads.chosen_threads({"VIT_THREADS": value})


def test_use_free_cores_sets_torchs_threads_once_per_process(monkeypatch):
    import torch

    before = torch.get_num_threads()
    threads.use_free_cores.cache_clear()
    monkeypatch.setenv("VIT_THREADS", "2")
    try:
        assert threads.use_free_cores() == 2 and torch.get_num_threads() == 2
        monkeypatch.setenv("VIT_THREADS", "1")
        assert threads.use_free_cores() == 2  # chosen at start, not at every call
    finally:
        threads.use_free_cores.cache_clear()
        torch.set_num_threads(before)


def test_a_command_refuses_a_bad_vit_threads_in_one_line(monkeypatch, capsys, tmp_path):
    from vit import predict

    threads.use_free_cores.cache_clear()
    monkeypatch.setenv("VIT_THREADS", "many")
    (tmp_path / "model.pt").write_bytes(b"")  # paths that exist: a missing one is reported first, before torch
    (tmp_path / "photo.png").write_bytes(b"")
    try:
        assert predict.main([str(tmp_path / "model.pt"), str(tmp_path / "photo.png")]) == 2
    finally:
        threads.use_free_cores.cache_clear()
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "vit.predict: error: VIT_THREADS must be a whole number of at least 1, got 'many'"]


def test_at_most_lowers_the_count_for_the_block_never_raises_it_and_restores_it():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with threads.at_most(1) as used:
            assert used == 1 and torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with threads.at_most(8) as used:
            assert used == 2 and torch.get_num_threads() == 2
        with pytest.raises(RuntimeError), threads.at_most(1):
            raise RuntimeError("the work failed")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
