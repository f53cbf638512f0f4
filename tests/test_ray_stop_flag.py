"""A Ray run's stop flag (``vit.runs.stop_flag``) through Ray's own key-value wrappers over a stand-in for the GCS
client: no cluster. That a real run stops through it is the Ctrl-C and Stop tests' (test_ray_train.py)."""

from __future__ import annotations

import pickle
import signal
import threading

import pytest

from vit.runs.stop_flag import NAMESPACE, StopFlag, watch
from vit.training.session import StopRequest


class FakeGcs:
    """The three calls of Ray's GcsClient that ``ray.experimental.internal_kv`` makes, over a dict; as the GCS's,
    ``internal_kv_put`` returns how many keys it added."""

    def __init__(self, fail: int = 0) -> None:
        self.store: dict[tuple[bytes, bytes], bytes] = {}
        self.fail, self.gets = fail, 0

    def internal_kv_get(self, key, namespace, timeout=None):
        self.gets += 1
        if self.gets <= self.fail:
            raise ConnectionError("the GCS is restarting")
        return self.store.get((namespace, key))

    def internal_kv_put(self, key, value, overwrite, namespace, timeout=None):
        if (namespace, key) in self.store and not overwrite:
            return 0
        self.store[(namespace, key)] = value
        return 1

    def internal_kv_del(self, key, del_by_prefix, namespace, timeout=None):
        return 1 if self.store.pop((namespace, key), None) is not None else 0


@pytest.fixture
def gcs():
    from ray.experimental import internal_kv

    before = internal_kv.global_gcs_client
    fake = FakeGcs()
    internal_kv._initialize_internal_kv(fake)
    yield fake
    internal_kv._internal_kv_reset()
    if before is not None:
        internal_kv._initialize_internal_kv(before)


def test_the_first_signal_is_kept_for_its_run_only_until_cleared(gcs):
    flag, other = StopFlag(), StopFlag()
    assert flag.key != other.key  # two runs never share a flag
    assert flag.requested() is None
    flag.request(signal.SIGTERM)
    flag.request(signal.SIGINT)  # a second signal: the first one stays, as the actor's did
    assert flag.requested() == signal.SIGTERM and other.requested() is None
    assert list(gcs.store) == [(NAMESPACE.encode(), flag.key.encode())]  # in our namespace
    copy = pickle.loads(pickle.dumps(flag))  # what a worker gets in its config: the key alone
    assert copy.key == flag.key and copy.requested() == signal.SIGTERM
    flag.clear()
    assert gcs.store == {} and flag.requested() is None


def test_a_worker_turns_the_request_into_its_own_stop_and_a_failed_read_is_retried():
    from ray.experimental import internal_kv

    fake = FakeGcs(fail=2)  # the first two reads fail: the watcher keeps polling
    internal_kv._initialize_internal_kv(fake)
    try:
        flag, stop, done = StopFlag(), StopRequest(), threading.Event()
        watcher = threading.Thread(target=watch, args=(flag, stop, done, 0.01), daemon=True)
        watcher.start()
        threading.Timer(0.1, flag.request, (signal.SIGTERM,)).start()
        watcher.join(5)
        assert not watcher.is_alive() and stop.signum == signal.SIGTERM and fake.gets > 2
        assert stop.requested  # what the training loop reads between steps
    finally:
        internal_kv._internal_kv_reset()


def test_a_worker_whose_run_ended_stops_watching_without_a_stop(gcs):
    stop, done = StopRequest(), threading.Event()
    done.set()
    watch(StopFlag(), stop, done, 0.01)
    assert stop.signum is None and gcs.gets == 0
