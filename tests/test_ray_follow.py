"""Following a Ray job from a command (``vit.runs.ray_jobs.follow_to_the_end``) with a stand-in for Ray's job
client: no cluster, so the signal handling is tested where it is decided."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import warnings
from types import SimpleNamespace

import pytest

from vit.runs import ray_jobs


class QuietOnCancelJobs:
    """A job client whose log stream ends quietly when its task is cancelled (as a dropped websocket does) and
    whose job runs until stopped, or succeeds after its third log stream."""

    def __init__(self) -> None:
        self.stopped = False
        self.streams = 0

    async def tail_job_logs(self, sid):
        self.streams += 1
        yield "Running entrypoint for job\n"
        try:
            await asyncio.sleep(3)
        except asyncio.CancelledError:
            return

    def get_job_status(self, sid):
        if self.stopped:
            return SimpleNamespace(value="STOPPED")
        return SimpleNamespace(value="SUCCEEDED" if self.streams >= 3 else "RUNNING")

    def get_job_logs(self, sid):
        return ""

    def stop_job(self, sid):
        self.stopped = True


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_while_the_log_is_followed_stops_the_job(capsys, signum):
    # SIGTERM is the Train page's Stop: handled as a Ctrl-C (tests/test_ray_train.py stops a real job so)
    jobs = QuietOnCancelJobs()
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signum))  # inside the first log stream
    timer.start()
    try:
        code = ray_jobs.follow_to_the_end(jobs, "job-1", "vit.analyze", "the analysis ends without its report")
    finally:
        timer.cancel()
    assert jobs.stopped and code == 130
    err = capsys.readouterr().err
    assert err.startswith("vit.analyze: stopping job job-1: the analysis ends without its report")
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before  # its own, for its length


class RaySdkJobs(QuietOnCancelJobs):
    """A job client whose log stream warns as Ray's SDK does (it hands aiohttp ssl=None) and whose job succeeds."""

    async def tail_job_logs(self, sid):
        warnings.warn("ssl=None is deprecated, please use ssl=True", DeprecationWarning, stacklevel=2)
        yield "done\n"

    def get_job_status(self, sid):
        return SimpleNamespace(value="SUCCEEDED")


def test_following_a_job_does_not_pass_on_the_sdks_ssl_deprecation():
    written = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning that gets out fails the follow
        assert ray_jobs.follow(RaySdkJobs(), "job-1", written.append) == "SUCCEEDED"
    assert written == ["done\n"]
    with warnings.catch_warnings(record=True) as caught:  # and another of the stream's warnings still does
        warnings.simplefilter("always")

        class OtherWarning(RaySdkJobs):
            async def tail_job_logs(self, sid):
                warnings.warn("something else", DeprecationWarning, stacklevel=2)
                yield "done\n"

        ray_jobs.follow(OtherWarning(), "job-1", written.append)
    assert [str(w.message) for w in caught] == ["something else"]
