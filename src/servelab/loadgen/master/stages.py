"""The master's record of the run's stages: each one as the shape last described it (start,
reached, measured window, end), the newest being the current one, and its ``stages`` row."""
from __future__ import annotations

import dataclasses

from servelab.loadgen.messages import StageMessage
from servelab.store.rows import StageRow

_COLUMNS = tuple(f.name for f in dataclasses.fields(StageRow) if f.name != "run_id")


class StageRecords:
    def __init__(self, run_id: str):
        self.run_id = run_id
        self.by_index: dict[int, StageMessage] = {}
        self.current: StageMessage | None = None
        self._version = 0

    def begin(self, stage: StageMessage) -> tuple[StageMessage, StageRow]:
        """A new stage, or a new description of one (reached, window set or cut short). The
        version lets a worker ignore an update that an even newer one overtook."""
        self._version += 1
        stage = stage.with_(version=self._version)
        self.by_index[stage.stage] = stage
        if self.current is None or stage.stage >= self.current.stage:
            self.current = stage
        return stage, self.row(stage)

    def end(self, index: int, t_unix: float) -> StageRow | None:
        """The stage's end, once (None if it is unknown or already ended)."""
        stage = self.by_index.get(index)
        if stage is None or stage.ended_unix is not None:
            return None
        stage = stage.with_(ended_unix=t_unix)
        self.by_index[index] = stage
        return self.row(stage)

    def row(self, stage: StageMessage) -> StageRow:
        return StageRow(self.run_id, **{k: getattr(stage, k) for k in _COLUMNS})

