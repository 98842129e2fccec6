"""ADE20K and Cityscapes layouts: same samples as gluoncv's own dataset classes."""
import numpy as np
import pytest

from gluon_data import SegmentationRecordDataset
from gluon_data import convert
from gluon_data.errors import ConversionError
from gluon_data.convert.sample import make_ade20k, make_cityscapes


def sorted_order(ref):
    return sorted(range(len(ref)), key=lambda i: ref.images[i])


def test_ade20k_matches_gluoncv_with_the_shift_done_at_conversion(tmp_path):
    from gluoncv.data import ADE20KSegmentation
    base = make_ade20k(str(tmp_path / "ade"))
    out = str(tmp_path / "ade.rec")
    rep = convert(base, out, split="train,val")  # layout detected
    assert rep.written == {"train": 6, "val": 3}
    ours = SegmentationRecordDataset(str(tmp_path / "ade_val.rec"), mode="testval")
    ref = ADE20KSegmentation(root=str(tmp_path / "ade"), split="val", mode="testval")
    assert len(ours) == len(ref) == 3
    for i, j in enumerate(sorted_order(ref)):  # gluoncv keeps os.listdir order, we sort
        np.testing.assert_array_equal(ours[i][1].asnumpy(), ref[j][1].asnumpy())
        assert np.abs(ours[i][0].asnumpy().astype(int) - ref[j][0].asnumpy()).max() <= 2
    assert ours.num_class == 150 and ours.pred_offset == 1 and ours.classes[0] == "wall"
    raw = SegmentationRecordDataset(str(tmp_path / "ade_val.rec"), ignore_value=None)
    assert set(np.unique(raw[0][1].asnumpy())) <= set(range(150)) | {255}


def test_cityscapes_label_ids_become_the_19_train_ids(tmp_path):
    from gluoncv.data import CitySegmentation
    root = make_cityscapes(str(tmp_path / "citys"))
    out = str(tmp_path / "c.rec")
    convert(root, out, "cityscapes", split="val")
    ours = SegmentationRecordDataset(out, mode="testval")
    ref = CitySegmentation(root=root, split="val", mode="testval")
    assert len(ours) == len(ref) == 4
    for i, j in enumerate(sorted_order(ref)):
        np.testing.assert_array_equal(ours[i][1].asnumpy(), ref[j][1].asnumpy())
    assert ours.num_class == 19 and ours.palette[0] == [128, 64, 128]
    assert set(np.unique(np.concatenate([ours[i][1].asnumpy().ravel() for i in range(4)]))) \
        <= set(range(19)) | {-1}


def test_unknown_split_lists_the_available_ones(tmp_path):
    base = make_ade20k(str(tmp_path / "ade"), 1, 1)
    with pytest.raises(ConversionError, match="available: train, val"):
        convert(base, str(tmp_path / "a.rec"), "ade20k", split="test")
