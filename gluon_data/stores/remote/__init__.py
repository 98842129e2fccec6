"""Datasets in object storage (``s3://``, ``gs://``, ``https://`` ...) through fsspec.

Training reads download whole objects into the one local cache (atomically, verified against
the SHA-256 the dataset's metadata records, under one size limit) and read them with the local
reader; inspection reads (``info``, ``show``, ``verify``) fetch only the bytes they need with
ranged GETs. fsspec and s3fs are imported only when a URI is used (``pip install
gluon-data[remote]``).

:mod:`.describe` says what a remote location is made of, :mod:`.ranged` reads ranges of a
remote ``.rec``, :mod:`.stores` is the one remote store, :mod:`.commit` the one upload
protocol (marker, objects, commit document last). Uploads of converted datasets are the
converter's (:mod:`gluon_data.convert.upload`); every remote call goes through
:mod:`gluon_data.storage.remotefs` (one retry and time-bound policy).
"""
