"""The checkout whose ``reservoir`` a benchmark imports: this one, or ``$RESERVOIR_CHECKOUT`` (a script timing
another checkout, as ``job_before_after.py`` does through ``gpu.py``). Importing this puts it first on
``sys.path``, once, whichever module imports it first."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(os.environ.get("RESERVOIR_CHECKOUT") or Path(__file__).resolve().parents[1]).resolve()
if str(ROOT) not in sys.path[:1]:
    sys.path.insert(0, str(ROOT))
