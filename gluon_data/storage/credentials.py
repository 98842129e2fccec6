"""Which credentials a shard task uses, and how a client forwards its own.

The rule: a task uses the storage options it was given (``--storage-option``, or
``storage_options=``: they travel with the task) and, for everything else, the environment
of the machine running it (``AWS_*`` variables, profiles, an instance role). The client's
own environment is forwarded only when asked (``--forward-credentials``,
``forward_credentials=True``): :func:`forward_options` resolves it here and puts it into the
task's storage options, in memory only. Forwarded secrets are :class:`Secret` strings,
whose ``repr`` names a fingerprint, not the value, so no log line, task repr or error message
built from the options shows them; nothing writes storage options into an object.
"""
from __future__ import annotations

import hashlib
import hmac
import os
from typing import Optional

from ..errors import RemoteError

__all__ = ["Secret", "forward_options"]

_KEY = os.urandom(16)  # per process: a fingerprint tells two secrets apart, never one's value


class Secret(str):
    """A credential string: behaves as its value, but its ``repr`` hides it."""

    def __repr__(self) -> str:
        tag = hmac.new(_KEY, self.encode("utf-8"), hashlib.sha256).hexdigest()[:8]
        return "<secret %s>" % tag

    def __reduce__(self):  # pickled for the task as a Secret, not a plain str
        return (Secret, (str.__str__(self),))


def forward_options(uri: str, storage_options: Optional[dict] = None) -> dict:
    """``storage_options`` completed with what this machine resolves for ``uri`` from its
    standard environment or profile (S3: access key, secret, session token, endpoint from
    ``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``, region); explicit options win.

    Raises
    ------
    ValueError
        ``uri`` is not an ``s3://`` URI (other schemes: configure the workers).
    RemoteError
        No credentials are found here.
    """
    opts = dict(storage_options or {})
    scheme = uri.split("://", 1)[0] if "://" in uri else ""
    if scheme not in ("s3", "s3a"):
        raise ValueError("--forward-credentials forwards S3 credentials; %s: configure the "
                         "workers' environment or pass --storage-option" % uri)
    import botocore.session
    session = botocore.session.Session(profile=opts.get("profile"))
    if not (opts.get("key") and opts.get("secret")) and not opts.get("anon"):
        creds = session.get_credentials()
        if creds is None:
            raise RemoteError("--forward-credentials: no credentials found in this machine's "
                              "environment or profile (AWS_ACCESS_KEY_ID, AWS_PROFILE, "
                              "~/.aws)", uri)
        creds = creds.get_frozen_credentials()
        opts.update(key=Secret(creds.access_key), secret=Secret(creds.secret_key))
        if creds.token:
            opts["token"] = Secret(creds.token)
    endpoint = (os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"))
    if endpoint and "endpoint_url" not in opts:
        opts["endpoint_url"] = endpoint
    region = session.get_config_variable("region")
    kwargs = dict(opts.get("client_kwargs") or {})
    if region and "region_name" not in kwargs:
        opts["client_kwargs"] = dict(kwargs, region_name=region)
    return opts
