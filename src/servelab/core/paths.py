"""Where the user-editable folders live (traffic_profiles/, servers/, analysis/, loadtests/).

The package is installed editable from the repository, so those folders sit two levels above
``src/servelab``. ``SERVELAB_HOME`` overrides that (a Docker image or another checkout).
"""
from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]
DATA_DIR = PACKAGE_DIR / "data"


def project_root() -> Path:
    env = os.environ.get("SERVELAB_HOME")
    if env:
        return Path(env).resolve()
    candidate = PACKAGE_DIR.parents[1]
    if (candidate / "traffic_profiles").is_dir():
        return candidate
    return Path.cwd()


def profiles_dir() -> Path:
    return project_root() / "traffic_profiles"


def servers_dir() -> Path:
    return project_root() / "servers"


def analysis_dir() -> Path:
    return project_root() / "analysis"


def loadtests_dir() -> Path:
    return project_root() / "loadtests"


def default_db() -> Path:
    return Path(os.environ.get("SERVELAB_DB", "results/servelab.duckdb"))
