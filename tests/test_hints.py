"""The one driver of read-ahead hints (gluon_data.sampling.hints.HintAhead), what drives it
(PrefetchSampler; the Gluon DataLoader's HintedBatches), and will_need's one way to wait."""
import importlib.util
import warnings

import pytest

from gluon_data.errors import FormatError
from gluon_data.sampling.hints import HintAhead, hint
from gluon_data.sampling.remote import PrefetchSampler
from gluon_data.stores.base import open_store, will_need


class Recorder:
    """A target that records the events: hints and reads, in order."""

    def __init__(self, log, fail=False):
        self.log, self.fail = log, fail

    def will_need(self, indices):
        self.log.append(("hint", list(indices)))
        if self.fail:
            raise FormatError("replaced", "x.rec")


def _drive(source, target, log, **kw):
    for item in HintAhead(source, target, **kw):
        log.append(("read", item))
    return log


def test_batches_are_hinted_ahead_batches_before_they_are_read():
    log = []
    _drive([[3, 1], [0, 2], [4], [5, 6]], Recorder(log), log, ahead=2)
    assert log == [("hint", [3, 1]), ("hint", [0, 2]), ("hint", [4]), ("read", [3, 1]),
                   ("hint", [5, 6]), ("read", [0, 2]), ("read", [4]), ("read", [5, 6])]
    log = []
    _drive([[3, 1], [0, 2]], Recorder(log), log)  # ahead=0: each as it is drawn
    assert log == [("hint", [3, 1]), ("read", [3, 1]), ("hint", [0, 2]), ("read", [0, 2])]


@pytest.mark.parametrize("ahead,window", [(0, 1), (3, 1), (3, 2), (7, 4), (20, 5)])
def test_indices_hinted_in_windows_each_once_and_at_least_ahead_early(ahead, window):
    log = []
    order = list(range(17))
    _drive(iter(order), Recorder(log), log, ahead=ahead, window=window, single=True)
    reads = [e[1] for e in log if e[0] == "read"]
    hints = [e[1] for e in log if e[0] == "hint"]
    assert reads == order  # unchanged, in order
    assert [i for h in hints for i in h] == order  # each hinted once, in order
    assert all(len(h) == window for h in hints[:-1]) and 0 < len(hints[-1]) <= window
    for k in order:  # when k is read, k..k+ahead (those there are) were hinted
        at = log.index(("read", k))
        hinted = {i for e in log[:at] if e[0] == "hint" for i in e[1]}
        assert set(range(k, min(k + ahead + 1, len(order)))) <= hinted


def test_a_failing_hint_is_dropped_and_a_target_without_will_need_left_alone():
    log = []
    _drive([[1], [2]], Recorder(log, fail=True), log, ahead=1)
    assert [e for e in log if e[0] == "read"] == [("read", [1]), ("read", [2])]
    assert list(HintAhead([[1]], object())) == [[1]]
    hint(Recorder(log), [])  # nothing to hint: no call
    assert log[-1] == ("read", [2])


def test_len_is_the_sources():
    assert len(HintAhead([[1], [2], [3]], None, 1)) == 3


def test_prefetch_sampler_hints_the_next_lookahead_indices_through_the_driver():
    log = []

    class Sampler:
        epoch = None

        def set_epoch(self, e):
            self.epoch = e

        def __len__(self):
            return 10

        def __iter__(self):
            return iter(range(9, -1, -1))

    inner = Sampler()
    sampler = PrefetchSampler(inner, Recorder(log), lookahead=4)
    sampler.set_epoch(3)
    assert inner.epoch == 3 and len(sampler) == 10
    got = []
    for k in sampler:
        hinted = {i for e in log if e[0] == "hint" for i in e[1]}
        assert set(range(max(k - 3, 0), k + 1)) <= hinted  # k and the 3 after it
        got.append(k)
    assert got == list(range(9, -1, -1))
    assert [i for e in log for i in e[1]] == got  # each index hinted once, one per window


def test_will_need_wait_on_a_local_store_returns_and_a_foreign_store_is_left_alone(voc_rec):
    store = open_store(voc_rec)
    will_need(store, [0, 1, 10 ** 6], wait=True)  # the kernel's read-ahead: nothing to wait for
    will_need(object(), [0], wait=True)
    assert store.read(0)


@pytest.mark.skipif(importlib.util.find_spec("mxnet") is None, reason="needs MXNet")
def test_the_gluon_loader_hints_through_the_one_driver_and_through_transforms():
    from gluon_data.gluon.loader import HintedBatches, prefetch_batch

    class Dataset:
        def __init__(self, log):
            self.log = log

        def will_need(self, indices):
            self.log.append(("hint", list(indices)))

    class Wrapped:  # what Gluon's .transform() makes: the dataset as ._data
        def __init__(self, data):
            self._data = data

    log = []
    batches = HintedBatches([[0, 1], [2, 3], [4]], Wrapped(Wrapped(Dataset(log))), ahead=1)
    assert isinstance(batches, HintAhead) and len(batches) == 3
    for b in batches:
        log.append(("read", b))
    assert log == [("hint", [0, 1]), ("hint", [2, 3]), ("read", [0, 1]), ("hint", [4]),
                   ("read", [2, 3]), ("read", [4])]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prefetch_batch(Wrapped(Dataset(log)), [7])
        prefetch_batch(object(), [8])
    assert log[-1] == ("hint", [7])
