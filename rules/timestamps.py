"""Best-effort time stamps from log lines, as seconds, to order errors across ranks and files.

Formats seen in training logs: ISO dates (`2023-07-10 14:26:28,977`, `[2024-04-18 10:46:28,089]`,
`2024-02-27T21:35:32.106313Z`, Slurm's `2024-04-20T09:09:37`, torchrun's box
`2024-09-11_09:17:37`) and glog headers without a year, month not always zero-padded (`[E1206 18:44:12.715298746 ...]`, `[E817 ...]`,
`W0227 17:39:41.936000 293817 ...`). Lines without a year get the year of the last full
date seen, so a job's stamps stay comparable with one another.
"""

from __future__ import annotations

import calendar
import re

_ISO = re.compile(
    r"(?<!\d)(\d{4})-(\d\d)-(\d\d)[T _](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?"
)
_GLOG = re.compile(r"(?:^|[\[\s:])[IWEF](\d{1,2})(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?")


def _fraction(digits: str | None) -> float:
    return int(digits) / 10 ** len(digits) if digits else 0.0


class TimestampReader:
    """Reads the first time stamp of a line; remembers the year for glog-style stamps."""

    def __init__(self, default_year: int = 1970):
        self.year = default_year

    def read(self, line: str) -> float | None:
        m = _ISO.search(line)
        if m:
            year, month, day, hh, mm, ss = (int(g) for g in m.groups()[:6])
            if not (1 <= month <= 12 and 1 <= day <= 31):
                return None
            self.year = year
            return calendar.timegm((year, month, day, hh, mm, ss)) + _fraction(m.group(7))
        m = _GLOG.search(line)
        if m:
            month, day, hh, mm, ss = (int(g) for g in m.groups()[:5])
            if not (1 <= month <= 12 and 1 <= day <= 31):
                return None
            return calendar.timegm((self.year, month, day, hh, mm, ss)) + _fraction(m.group(6))
        return None
