"""Which model a reference engine runs (`--reference-model`), built for its page size."""

from __future__ import annotations

import dataclasses
from typing import Protocol

from dsv4_engine.engine_config import ReferenceModelKind
from dsv4_engine.pools.device_pool import DevicePool
from dsv4_engine.pools.layout import ModelShape
from dsv4_engine.reference.echo.model import ECHO_SHAPE, EchoModel
from dsv4_engine.reference.model import REFERENCE_SHAPE, Chunk, ModelConfig, ReferenceModel


class Model(Protocol):
    shape: ModelShape

    def forward(self, pool: DevicePool, chunks: list[Chunk]) -> list[int]: ...


def load_model(kind: ReferenceModelKind, page_size: int, seed: int) -> Model:
    if kind is ReferenceModelKind.ECHO:
        return EchoModel(dataclasses.replace(ECHO_SHAPE, page_size=page_size))
    shape = dataclasses.replace(REFERENCE_SHAPE, page_size=page_size)
    return ReferenceModel(ModelConfig(shape=shape, seed=seed))
