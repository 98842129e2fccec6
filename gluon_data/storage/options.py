"""Keywords grouped by concern: :class:`RemoteOptions` (where a dataset in object storage is
read from and cached), and the one way every such group is given to a public callable (the
object, a mapping of its fields, or nothing) or was given before it existed (its fields as
separate keywords: still read, with a ``DeprecationWarning`` naming the new spelling)."""
from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple

__all__ = ["RemoteOptions", "grouped", "take_grouped", "refuse_unknown"]


def grouped(cls: Any, value: Any, owner: str, keyword: str) -> Any:
    """``value`` as a ``cls`` (a frozen dataclass of options): ``cls`` itself when ``None``
    (its defaults), the object as it is, or one made of a mapping of its fields. Anything
    else, or a mapping with a key that is not a field, is a ``TypeError`` naming ``owner``'s
    ``keyword`` and the valid fields."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(value) - set(names))
        if unknown:
            raise TypeError("%s(%s=...): no option %s in %s; valid: %s"
                            % (owner, keyword, ", ".join(map(repr, unknown)), cls.__name__,
                               ", ".join(names)))
        return cls(**value)
    raise TypeError("%s(%s=...) takes a %s (or a dict of its fields), got %r"
                    % (owner, keyword, cls.__name__, value))


def take_grouped(cls: Any, value: Any, owner: str, keyword: str, kwargs: dict,
                 stacklevel: int = 3) -> Any:
    """The ``cls`` of ``owner``'s ``keyword`` (see :func:`grouped`), or of the separate
    keywords it took before ``cls`` grouped them: those are removed from ``kwargs`` and read
    with a ``DeprecationWarning`` that names the new spelling (``stacklevel`` as for
    :func:`warnings.warn`, counted from the caller of this function's caller: the user's
    line). Both at once is a ``TypeError``."""
    names = [f.name for f in dataclasses.fields(cls)]
    old = {n: kwargs.pop(n) for n in names if n in kwargs}
    if not old:
        return grouped(cls, value, owner, keyword)
    spelled = ", ".join("%s=..." % n for n in old)
    if value is not None:
        raise TypeError("%s(%s=..., %s): give %s once, as %s=%s(...)"
                        % (owner, keyword, spelled, ", ".join(old), keyword, cls.__name__))
    warnings.warn("%s(%s): these keywords are deprecated; write %s=%s(%s) (%s.%s, or a dict "
                  "of the same keys)" % (owner, spelled, keyword, cls.__name__, spelled,
                                         cls.__module__, cls.__name__),
                  DeprecationWarning, stacklevel=stacklevel)
    return cls(**old)


def refuse_unknown(owner: str, kwargs: Mapping) -> None:
    """Python's own ``TypeError`` for a keyword ``owner`` does not take (what is left of its
    ``**kwargs`` once the deprecated spellings are taken)."""
    if kwargs:
        raise TypeError("%s() got an unexpected keyword argument %r"
                        % (owner, sorted(kwargs)[0]))


@dataclass(frozen=True, repr=False)
class RemoteOptions:
    """Where a dataset in object storage (a URI such as ``s3://bucket/train.rec``) is read
    from and cached: what a dataset class given a URI passes to the remote store
    (:class:`~gluon_data.stores.remote.stores.RemoteStore`) it opens. Given with a local
    path, any of them is a ``ValueError`` naming it (nothing would use it).

    Parameters
    ----------
    storage_options : dict, optional
        fsspec options (``endpoint_url``, ``key`` / ``secret``, ``anon``,
        ``client_kwargs``...); credentials default to the standard environment or profile.
        An empty dict configures nothing and counts as not given.
    cache_dir : str, optional
        Where the dataset is downloaded to (default ``$GLUON_DATA_CACHE_DIR`` or
        ``~/.cache/gluon_data``).
    cache_limit : int or str, optional
        How much that cache may hold (``"20GB"``; default ``$GLUON_DATA_CACHE_LIMIT`` or
        unlimited).

    Examples
    --------
    >>> opts = RemoteOptions(storage_options={"endpoint_url": "http://127.0.0.1:9000",
    ...                                       "secret": "not-shown"}, cache_limit="20GB")
    >>> opts                                    # option names only: values may be secrets
    RemoteOptions(storage_options={'endpoint_url': ..., 'secret': ...}, cache_limit='20GB')
    >>> sorted(opts.given())
    ['cache_limit', 'storage_options']
    >>> RemoteOptions(storage_options={}).given()
    {}
    """

    storage_options: Optional[dict] = None
    cache_dir: Optional[str] = None
    cache_limit: object = None

    @classmethod
    def names(cls) -> Tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    def given(self) -> dict:
        """The options set, as ``open_store`` keywords (an empty ``storage_options`` is not
        set: it configures nothing, as in pandas)."""
        return {n: getattr(self, n) for n in self.names()
                if getattr(self, n) is not None
                and not (n == "storage_options" and not self.storage_options)}

    def __repr__(self) -> str:
        parts = []
        for name, value in self.given().items():
            if name == "storage_options":
                value = "{%s}" % ", ".join("%r: ..." % k for k in value)
            else:
                value = repr(value)
            parts.append("%s=%s" % (name, value))
        return "RemoteOptions(%s)" % ", ".join(parts)
