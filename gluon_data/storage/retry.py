"""The one retry and time-bound policy of every remote call: :class:`RetryPolicy`, read from
the environment when a call is made, an explicit option (``remote_retries``) winning."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields
from typing import Mapping, Optional, Tuple

__all__ = ["RetryPolicy", "ENVIRONMENT", "attempt_limit", "call_bound"]

#: The defaults, where the environment sets nothing: transient failures are retried
#: ``RETRIES`` times, sleeping ``BACKOFF * 2**attempt`` seconds (at most ``MAX_SLEEP``) ...
RETRIES = 4
BACKOFF = 0.25
MAX_SLEEP = 10.0
#: ... each attempt bounded by the S3 client's connect and read timeouts (seconds;
#: ``storage_options``' ``config_kwargs`` override them) ...
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 60.0
#: ... and cancelled after ``connect + read timeout + n / MIN_RATE`` seconds when it moves
#: ``n`` bytes, whatever the client library does (a server that answers an upload's
#: ``Expect: 100-continue``, takes the body and never answers leaves aiohttp without any read
#: timeout).
MIN_RATE = 1e6

#: Field of :class:`RetryPolicy` -> the environment variable :meth:`RetryPolicy.from_env`
#: reads it from (``max_sleep`` has none).
ENVIRONMENT = {
    "retries": "GLUON_DATA_REMOTE_RETRIES",
    "backoff": "GLUON_DATA_REMOTE_BACKOFF",
    "connect_timeout": "GLUON_DATA_REMOTE_CONNECT_TIMEOUT",
    "read_timeout": "GLUON_DATA_REMOTE_READ_TIMEOUT",
    "min_rate": "GLUON_DATA_REMOTE_MIN_RATE",
}

# field -> (what it must be, whether 0 is allowed)
_WANT = {"retries": ("a non-negative integer", True),
         "backoff": ("a non-negative number of seconds", True),
         "max_sleep": ("a non-negative number of seconds", True),
         "connect_timeout": ("a positive number of seconds", False),
         "read_timeout": ("a positive number of seconds", False),
         "min_rate": ("a positive number of bytes per second", False)}


def _checked(name: str, value, source: str):
    """``value`` of field ``name`` as the policy holds it (an int or a float), else a
    :class:`ValueError` naming ``source`` (the variable or the option) and the value."""
    want, zero = _WANT[name]
    out: Optional[float]  # an int for "retries", else a float; None when invalid
    try:
        if name == "retries":
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            out = int(value.strip() if isinstance(value, str) else value)
        else:
            out = float(value)
        if isinstance(value, bool):
            raise ValueError
    except (TypeError, ValueError):
        out = None
    if out is None or not math.isfinite(out) or out < 0 or (out == 0 and not zero):
        raise ValueError("%s must be %s, got %r" % (source, want, value)
                         + ("; set it to one, or unset it for the default"
                            if source.startswith("GLUON_DATA_") else ""))
    return out


@dataclass(frozen=True)
class RetryPolicy:
    """How every remote call is retried and bounded (:class:`~gluon_data.storage.remotefs.Remote`
    makes each call through it; botocore and s3fs make one attempt each).

    Parameters
    ----------
    retries : int
        Times a transient failure (connection refused or reset, a timeout, a short read) is
        retried: ``retries + 1`` attempts in all.
    backoff, max_sleep : float
        Seconds slept before attempt ``k`` (from 1): ``min(max_sleep, backoff * 2**(k-1))``.
    connect_timeout, read_timeout : float
        The S3 client's timeouts (``storage_options``' ``config_kwargs`` override them).
    min_rate : float
        Slowest transfer in bytes/s an attempt may make: one moving ``n`` bytes is cancelled
        after ``connect_timeout + read_timeout + n / min_rate`` seconds.

    Examples
    --------
    >>> RetryPolicy.from_env(retries=1, backoff=0.5, environ={}).sleeps()
    (0.5,)
    >>> RetryPolicy(retries=2, backoff=1.0, max_sleep=1.5).sleeps()
    (1.0, 1.5)
    """

    retries: int = RETRIES
    backoff: float = BACKOFF
    max_sleep: float = MAX_SLEEP
    connect_timeout: float = CONNECT_TIMEOUT
    read_timeout: float = READ_TIMEOUT
    min_rate: float = MIN_RATE

    def __post_init__(self):
        for f in fields(self):
            object.__setattr__(self, f.name, _checked(f.name, getattr(self, f.name),
                                                      "the retry policy's %s" % f.name))

    @classmethod
    def from_env(cls, retries: Optional[int] = None, backoff: Optional[float] = None,
                 environ: Optional[Mapping[str, str]] = None) -> "RetryPolicy":
        """The policy as the environment (``environ``, default :data:`os.environ`, read
        now) sets it (:data:`ENVIRONMENT`), the defaults for what it does not set, and
        ``retries`` / ``backoff`` (the ``remote_retries`` option...) instead, when given.

        Raises
        ------
        ValueError
            A variable (or an explicit value) that is not a valid number for its field,
            named with the value found.
        """
        environ = os.environ if environ is None else environ
        values = {}
        for name, var in ENVIRONMENT.items():
            raw = environ.get(var)
            if raw is not None and raw.strip() != "":
                values[name] = _checked(name, raw, var)
        for name, value in (("retries", retries), ("backoff", backoff)):
            if value is not None:
                values[name] = _checked(name, value, "the remote call's %s (%s=)" % (
                    name, "remote_retries" if name == "retries" else name))
        return cls(**values)

    @property
    def attempts(self) -> int:
        return self.retries + 1

    def sleep_before(self, attempt: int) -> float:
        """Seconds to sleep before attempt ``attempt`` (0: the first, no sleep)."""
        return 0.0 if attempt <= 0 else min(self.max_sleep, self.backoff * 2 ** (attempt - 1))

    def sleeps(self) -> Tuple[float, ...]:
        """Every sleep of a call that spends all its retries."""
        return tuple(self.sleep_before(k) for k in range(1, self.attempts))

    def client_config(self, storage_options: Optional[dict] = None) -> dict:
        """botocore's ``config_kwargs`` for S3: this policy's timeouts and one attempt per
        call (``total_max_attempts``: botocore's ``max_attempts`` counts retries, and 1 was
        a second request; only the policy retries), under what ``storage_options``'
        ``config_kwargs`` set."""
        config = {"connect_timeout": self.connect_timeout, "read_timeout": self.read_timeout,
                  "retries": {"total_max_attempts": 1}}
        config.update((storage_options or {}).get("config_kwargs") or {})
        return config

    def attempt_limit(self, storage_options: Optional[dict] = None, nbytes: int = 0) -> float:
        """Seconds after which one attempt moving ``nbytes`` is cancelled."""
        config = self.client_config(storage_options)
        return (float(config["connect_timeout"]) + float(config["read_timeout"])
                + max(0, int(nbytes)) / self.min_rate)

    def call_bound(self, storage_options: Optional[dict] = None, nbytes: int = 0) -> float:
        """Seconds one call moving ``nbytes`` may take at most before it raises: every
        attempt at its limit, plus the sleeps between them."""
        return self.attempts * self.attempt_limit(storage_options, nbytes) + sum(self.sleeps())


def attempt_limit(storage_options: Optional[dict] = None, nbytes: int = 0) -> float:
    """Seconds after which one attempt of a remote call moving ``nbytes`` is cancelled:
    the connect and read timeouts (``storage_options``' ``config_kwargs``, else the
    environment now) plus ``nbytes`` at the minimum rate (:class:`RetryPolicy`)."""
    return RetryPolicy.from_env().attempt_limit(storage_options, nbytes)


def call_bound(retries: Optional[int] = None, backoff: Optional[float] = None,
               storage_options: Optional[dict] = None, nbytes: int = 0) -> float:
    """Seconds one remote call moving ``nbytes`` may take at most before it raises
    (:class:`~gluon_data.errors.RemoteConnectionError` once the retries are spent):
    ``retries + 1`` attempts of at most :func:`attempt_limit` each, plus the backoff sleeps
    between them, under the policy the environment sets now (``retries`` and ``backoff``
    win when given). botocore makes one attempt per call and s3fs one try (their own retry
    loops, with their own sleeps, multiplied the time by 5 and more): every retry is the
    policy's, and every attempt of an asynchronous filesystem (s3fs, gcsfs, HTTP) is
    cancelled at its limit.

    >>> round(call_bound(retries=1, backoff=0.5,
    ...                  storage_options={"config_kwargs": {"connect_timeout": 1,
    ...                                                     "read_timeout": 2}}), 2)
    6.5
    """
    return RetryPolicy.from_env(retries, backoff).call_bound(storage_options, nbytes)
