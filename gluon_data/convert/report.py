"""What a conversion reports: :class:`ConversionReport`, what it wrote, kept, resumed and
skipped; ``str(report)`` is the command line's summary."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List

__all__ = ["ConversionReport"]


@dataclass
class ConversionReport:
    """What a conversion wrote and skipped. ``str(report)`` is the CLI's summary."""

    outputs: Dict[str, str] = field(default_factory=dict)
    written: Dict[str, int] = field(default_factory=dict)
    skipped: List[Dict[str, str]] = field(default_factory=list)
    bytes_written: int = 0
    seconds: float = 0.0
    #: records of shards a rerun found complete and kept (not in ``written``), per split
    kept: Dict[str, int] = field(default_factory=dict)
    kept_shards: int = 0
    #: records a ``--resume`` found written before the interruption (in ``written``: the
    #: output holds them; not in the rate, which is this run's), per split
    resumed: Dict[str, int] = field(default_factory=dict)
    #: shards of the dataset this one replaced (other shard count or container) removed once
    #: it was written; and those left: changed since the replaced manifest named them, no
    #: longer ours, or not removable (with the reason)
    removed: List[str] = field(default_factory=list)
    left: List[Dict[str, str]] = field(default_factory=list)

    @property
    def total_written(self) -> int:
        return sum(self.written.values())

    def __str__(self) -> str:
        lines = []
        paths = list(self.outputs.values())
        for split, path in self.outputs.items():
            kept = self.kept.get(split, 0)
            shared = paths.count(path) > 1  # several splits in one LMDB: name each
            written, resumed = self.written.get(split, 0), self.resumed.get(split, 0)
            if not resumed:
                before = ""
            elif resumed == written:
                before = " (complete already, kept by --resume)"
            else:
                before = " (%d of them before the interruption, kept by --resume)" % resumed
            lines.append("wrote %d records to %s%s%s%s" % (
                written, path, " split %s" % split if shared else "",
                " (%d kept)" % kept if kept else "", before))
        new = self.total_written - sum(self.resumed.values())  # this run's own
        rate = new / self.seconds if self.seconds > 0 else 0.0
        kept = sum(self.kept.values())
        done = ("%d records written, %d kept in %d shard%s already complete"
                % (self.total_written, kept, self.kept_shards,
                   "" if self.kept_shards == 1 else "s")) if kept else (
            "%d written" % self.total_written)
        if self.resumed and new:  # the rate is this run's: say what it counts
            done += " (%d in this run)" % new
        if self.resumed and not new:  # a --resume of a conversion that had finished
            lines.append("nothing left to convert: %d records complete already, %d skipped"
                         % (self.total_written, len(self.skipped)))
        else:
            lines.append("%s, %d skipped, %.1f MB%s in %.1f s (%.0f items/s)"
                         % (done, len(self.skipped), self.bytes_written / 1e6,
                            " in all" if self.resumed else "", self.seconds, rate))
        for s in self.skipped:
            lines.append("  skipped %s: %s" % (s["file"], s["reason"]))
        if self.removed:
            lines.append("removed %d shard%s of the dataset this one replaces" % (
                len(self.removed), "" if len(self.removed) == 1 else "s"))
        for s in self.left:
            lines.append("  left %s: %s" % (s["file"], s["reason"]))
        return "\n".join(lines)
