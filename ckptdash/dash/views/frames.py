"""Table frames whose column types never change, whatever the rows.

Panel derives each Tabulator column's sorter from the dtypes of the frame it is given. A column
whose dtype changes (an empty frame's ``object`` becoming ``int64`` when the first row arrives,
or an all-``None`` column becoming numbers) changes the table's configuration, and the browser
then rebuilds the whole table; rows that reach the page while it rebuilds are never drawn (seen
as a checkpoint table that stayed empty after its first save). With fixed dtypes the
configuration is sent once and every later update only replaces the data.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import pandas as pd

NUMBER: Final = "float64"  # missing values are NaN, which the number formatters show as "–"
TIME: Final = "datetime64[ns]"
TEXT: Final = "object"


def typed_frame(rows: Iterable[Mapping[str, Any]], schema: Mapping[str, str]) -> pd.DataFrame:
    """``rows`` as a frame with ``schema``'s columns, in its order and with its dtypes."""
    return pd.DataFrame(list(rows), columns=list(schema)).astype(dict(schema))
