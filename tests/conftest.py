"""Collection order for the parallel pass (`make test`: pytest-xdist, `--dist loadfile`).

xdist hands whole files to its workers in collection order, each as a worker frees up. Collected
alphabetically, a file of several minutes (the Docker end-to-end one) could come last and keep one
worker busy while the other sits idle: the longest files go first (longest-processing-time
scheduling), then the rest in their usual order. Only the order changes, never what runs. The list
is the files whose tests took longest in a full run (pytest --durations); a file missing from it
just keeps its place.
"""
from __future__ import annotations

LONGEST_FIRST = (
    "orchestration/test_compose_e2e.py",
    "orchestration/test_demo.py",
    "orchestration/test_matrix.py",
    "analysis/test_compare.py",
    "loadgen/test_web_browser.py",
    "loadgen/test_hostile_server.py",
    "loadgen/test_signals.py",
    "analysis/test_answer.py",
    "loadgen/test_hostile_endpoints.py",
    "orchestration/test_sglang_matrix.py",
    "analysis/test_report_e2e.py",
    "loadgen/test_run_phases.py",
    "loadgen/test_run_failures.py",
    "loadgen/test_api_key_run.py",
)


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def key(item):
        path = item.path.as_posix()
        return next((r for name, r in rank.items() if path.endswith("tests/" + name)),
                    len(rank))

    items.sort(key=key)   # stable: within a rank, and for every other file, the usual order
