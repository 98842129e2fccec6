"""How often a conversion checkpoints: by time and bytes unless ``checkpoint_every`` asks for
a count, never right before its own publish, and the output the same either way."""
import pytest

from gluon_data import convert
from gluon_data.convert import loop, resume
from gluon_data.sample import make_voc


@pytest.fixture(scope="module")
def voc150(tmp_path_factory):
    return make_voc(str(tmp_path_factory.mktemp("voc150") / "VOC2012"), num_images=150,
                    size_range=(16, 24), seed=3)


def _saves(monkeypatch):
    done = []
    real = resume._Checkpoint.save

    def save(self, split, n, *a):
        done.append(n)
        return real(self, split, n, *a)
    monkeypatch.setattr(resume._Checkpoint, "save", save)
    return done


def test_default_checkpoints_by_time_not_every_64_items(voc150, tmp_path, monkeypatch):
    ref = str(tmp_path / "ref.rec")
    convert(voc150, ref, "voc", split="trainval", checkpoint_every=8)
    done = _saves(monkeypatch)
    monkeypatch.setattr(loop, "CHECKPOINT_SECONDS", 1e9, raising=False)
    out = str(tmp_path / "out.rec")
    convert(voc150, out, "voc", split="trainval")
    assert done == []  # a run faster than the interval spends no time in checkpoints
    assert open(out, "rb").read() == open(ref, "rb").read()
    assert open(out[:-4] + ".idx").read() == open(ref[:-4] + ".idx").read()


def test_due_checkpoints_wait_for_64_items_and_skip_the_last(voc150, tmp_path, monkeypatch):
    done = _saves(monkeypatch)
    monkeypatch.setattr(loop, "CHECKPOINT_SECONDS", 0.0, raising=False)
    rep = convert(voc150, str(tmp_path / "a.rec"), "voc", split="trainval")
    n = rep.written["trainval"]
    assert n > 128
    assert done == [64, 128]  # time is always up here; the publish records the end
    del done[:]
    rep = convert(voc150, str(tmp_path / "b.rec"), "voc", split="train,val", checkpoint_every=20)
    train, val = rep.written["train"], rep.written["val"]
    # explicit: every 20 items; a split's end is checkpointed unless it is the last
    assert done == (list(range(20, train, 20)) + [train] + list(range(20, val, 20)))
