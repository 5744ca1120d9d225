"""The field types that events, commands and settings share (docs/format.md, "Records").

They hold what a line may carry whatever its kind: the format version, the save triggers,
and the bounds of numbers and times, so :mod:`ckptdash.events` and
:mod:`ckptdash.events.commands` agree on them without importing each other.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal, TypeAlias, get_args

import msgspec

FORMAT_VERSION: Final = 1

Trigger: TypeAlias = Literal["periodic", "manual", "signal", "exception", "api", "final"]
TRIGGERS: Final[tuple[str, ...]] = get_args(Trigger)

MAX_INT: Final = 2**63 - 1
"""The largest step, attempt, rank, epoch or size a record may hold (a signed 64-bit integer):
larger numbers overflow the int64 columns of the views."""
MAX_TIME: Final = 2.0**32
"""The latest time (Unix seconds, in 2106) and the longest duration a record may hold. A node
with a broken clock writes years like 2300, which date libraries cannot draw; such a line is
counted as ``invalid`` instead of hiding every run of the folder."""

NonNegInt = Annotated[int, msgspec.Meta(ge=0, le=MAX_INT)]
NonNegFloat = Annotated[float, msgspec.Meta(ge=0, le=MAX_TIME)]
Seconds = Annotated[float, msgspec.Meta(ge=-MAX_TIME, le=MAX_TIME)]
NonEmptyStr = Annotated[str, msgspec.Meta(min_length=1)]

DECODE_ERRORS: Final = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)
"""Every way decoding untrusted bytes can fail: besides malformed JSON and a schema mismatch,
msgspec raises ``RecursionError`` for a value nested thousands deep (``[[[[…``), even inside a
field it skips. Catch all three wherever bytes from a run directory are decoded."""

# One encoder for every record: encoding keeps no state between calls.
encoder: Final = msgspec.json.Encoder()
