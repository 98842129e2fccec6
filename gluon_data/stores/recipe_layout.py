"""``RecipeLayout``: what the original recipe's raw-array LMDB holds and how, which the layout
itself does not record (the arrays' shapes and order, the ignore label, the class count)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Tuple

__all__ = ["RecipeLayout"]


@dataclass(frozen=True)
class RecipeLayout:
    """The description a raw-array LMDB (``<split>_data`` / ``<split>_label``) is read with:
    :class:`~gluon_data.stores.legacy.RecipeLMDBStore` takes it as keywords
    (:meth:`store_options`), :class:`gluon_data.RecipeLMDBDataset` as ``layout=``.

    Parameters
    ----------
    image_shape : tuple of int
        Stored image shape, ``(H, W, C)`` or ``(C, H, W)`` with ``channels_first``;
        required to read (the store says so when it is missing).
    mask_shape : tuple of int, optional
        Stored mask shape (default: the image's ``(H, W)``).
    channels_first, bgr : bool
        Storage order of the image arrays.
    ignore_label : int, optional
        Mask value meaning "unlabelled", returned as the dataset's ``ignore_value``
        (``None``: no mapping).
    num_classes : int, optional
        The class count (``num_class``); the layout does not store it.

    Examples
    --------
    >>> layout = RecipeLayout((24, 32, 3), ignore_label=255, num_classes=21)
    >>> sorted(layout.store_options())[:3]
    ['bgr', 'channels_first', 'ignore_label']
    """

    image_shape: Optional[Tuple[int, ...]] = None
    mask_shape: Optional[Tuple[int, ...]] = None
    channels_first: bool = False
    bgr: bool = False
    ignore_label: Optional[int] = None
    num_classes: Optional[int] = None

    def store_options(self) -> dict:
        """The keywords of ``open_store(path, split, layout="raw-lmdb", ...)``."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
