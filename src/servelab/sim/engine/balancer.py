"""Several engines for one variant (``--data-parallel-size`` or separate instances), and the
least-outstanding-requests choice that both the HTTP server and the virtual runner use."""
from __future__ import annotations

from collections.abc import Sequence as Seq

from servelab.sim.engine.engine import Engine
from servelab.specs.cost_calibration import CostParams
from servelab.specs.engine_config import EngineConfig


def make_engines(config: EngineConfig, seed: int = 0, count: int | None = None,
                 cost: CostParams | None = None) -> list[Engine]:
    """One engine per data-parallel rank (each on its own GPU group of ``tensor_parallel_size``);
    ``cost`` changes the simulator's coefficients (calibration, what-if runs)."""
    n = config.data_parallel_size if count is None else count
    return [Engine(config, seed=seed, engine_index=i, cost=cost) for i in range(n)]


def least_outstanding(loads: Seq[int]) -> int:
    """Index of the smallest load; ties go to the lowest index (deterministic)."""
    best = 0
    for i in range(1, len(loads)):
        if loads[i] < loads[best]:
            best = i
    return best


def pick_engine(engines: Seq[Engine]) -> int:
    return least_outstanding([e.num_outstanding for e in engines])
