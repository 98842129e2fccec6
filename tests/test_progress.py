"""The one progress bar (:func:`gluon_data.tools.progress.progress_bar`, the conversions' and
the training recipe's) on a real terminal: a pty whose size is 0x0 (never set, as on some CI
runners and ``docker exec -t``) gets a bar of a fixed width instead of nothing."""
import fcntl
import os
import pty
import re
import select
import struct
import termios

import pytest

pytest.importorskip("tqdm")

from gluon_data.tools import progress as _progress  # noqa: E402
from gluon_data.tools.progress import progress_bar  # noqa: E402

FALLBACK_COLUMNS = getattr(_progress, "FALLBACK_COLUMNS", 80)  # (named by the fix)


def _draw_on_pty(rows, cols, steps=10):
    """Everything a bar of ``steps`` writes to a pty of ``rows`` x ``cols``."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    assert os.get_terminal_size(slave) == (cols, rows)
    out = b""
    with os.fdopen(slave, "w", buffering=1) as f:
        bar = progress_bar(steps, "train", file=f)
        for _ in range(steps):
            bar.update(1)
        bar.close()
        f.flush()
        while select.select([master], [], [], 0.5)[0]:
            chunk = os.read(master, 1 << 16)
            if not chunk:
                break
            out += chunk
    os.close(master)
    return [ln for ln in re.split(r"[\r\n]+", out.decode("utf-8")) if ln]


def test_a_terminal_reporting_0x0_gets_a_bar_of_the_fallback_width():
    lines = _draw_on_pty(0, 0)
    assert lines, "the bar vanished on a 0x0 terminal"
    last = lines[-1]
    assert last.startswith("train: 100%|") and "10/10" in last, lines
    assert len(last) == FALLBACK_COLUMNS, (len(last), last)


def test_a_sized_terminal_still_sets_the_width():
    last = _draw_on_pty(24, 60)[-1]
    assert last.startswith("train: 100%|") and len(last) == 60, (len(last), last)


def test_the_size_is_asked_again_at_each_redraw(monkeypatch):
    """tqdm's dynamic width is kept: a terminal that reports 0 columns later (asked at each
    redraw) falls back to the fixed width then too."""
    import io
    from gluon_data.tools import progress
    sizes = iter([(50, 20)] + [(0, 0)] * 100)
    monkeypatch.setattr(progress.os, "get_terminal_size",
                        lambda fd: os.terminal_size(next(sizes)))
    buf = io.StringIO()
    buf.fileno = lambda: 99  # a "terminal": its size comes from the query above
    bar = progress_bar(4, "train", file=buf)
    bar.update(4)
    bar.close()
    lines = [ln for ln in re.split(r"[\r\n]+", buf.getvalue()) if ln]
    assert len(lines[0]) == 50 and len(lines[-1]) == FALLBACK_COLUMNS, lines
