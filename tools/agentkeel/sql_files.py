"""Find the SQL folders (schema/, functions/, policies/) in a wheel or a checkout."""

from __future__ import annotations

import os
from pathlib import Path

SQL_FOLDERS = ("schema", "functions", "policies")


def sql_root() -> Path:
    """The folder that holds schema/, functions/ and policies/.

    Order: $AGENTKEEL_SQL_DIR; the copy force-included into an installed wheel
    (agentkeel/sql); the checkout this module lives in (editable installs).
    """
    override = os.environ.get("AGENTKEEL_SQL_DIR")
    if override:
        root = Path(override)
        if not (root / "schema").is_dir():
            raise FileNotFoundError(f"AGENTKEEL_SQL_DIR={override} has no schema/ folder")
        return root
    here = Path(__file__).resolve().parent
    for candidate in (here / "sql", here.parents[1]):
        if (candidate / "schema").is_dir() and (candidate / "functions").is_dir():
            return candidate
    raise FileNotFoundError(
        "agentkeel cannot find its SQL files (schema/, functions/, policies/): "
        "reinstall the package, or set AGENTKEEL_SQL_DIR"
    )
