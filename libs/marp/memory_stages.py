"""One given pipeline stage's memory, any rank of any split (a mixed plan's stage, ``marp.mixed``).

``memory_for_grid`` (``marp.memory_terms``) gives the first and the last stage of a layout,
charged the fullest rank's layers; ``memory_for_stages`` gives rank r of pp with exactly its own
blocks, the embeddings only where it is first, the head and the loss only where it is last, and its
own 1F1B micro-batches in flight -- the same terms and phases.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from marp.gpus import GpuType
from marp.memory_terms import _Job, _job, _layer, _Stage, _stage_terms, _to_bytes
from marp.models import ModelSpec
from marp.recipe import LayoutGrid, TrainingRecipe
from marp.sizes import in_flight, runtime_reserve_bytes


def _stage_at(job: _Job, rank: NDArray[np.int64], first: NDArray[np.bool_], last: NDArray[np.bool_]) -> _Stage:
    """Pipeline rank ``rank`` of every layout, holding exactly ``grid.stage_layers`` layers, the
    embeddings where ``first`` and the head and loss where ``last`` (a mixed plan's stage,
    ``marp.mixed``); a one-stage layout (pp 1) holds the whole model whatever the flags say."""
    g = job.grid
    single = g.pp == 1
    is_first, is_last = np.asarray(first, dtype=bool) | single, np.asarray(last, dtype=bool) | single
    units, mbs = in_flight(job.model.n_layers, g.pp, g.vpp, g.grad_accum, np.asarray(rank, dtype=np.int64),
                           g.stage_layers, g.chunk_layers)  # fmt: skip
    body = job.layers_stage * job.layer_local  # the blocks; first / last params add embeddings / head
    n_params = np.where(single, job.first_params,
                        body + np.where(is_first, job.first_params - body, 0) + np.where(is_last, job.last_params - body, 0))
    return _Stage(is_first=is_first, is_last=is_last, n_params=n_params, units=units, mbs=mbs)


def memory_for_stages(
    model: ModelSpec, recipe: TrainingRecipe, grid: LayoutGrid, gpu: GpuType | None, rank: NDArray[np.int64],
    first: NDArray[np.bool_], last: NDArray[np.bool_],
) -> dict[str, NDArray[np.int64]]:  # fmt: skip
    """The memory terms of one given pipeline rank per layout: rank ``rank`` of ``grid.pp``, with
    exactly ``grid.stage_layers`` (> 0) blocks, the embeddings where ``first`` and the head and
    loss where ``last`` -- any stage of an uneven split, middle ones included (``memory_for_grid``
    gives only the first and the last, charged the fullest rank's layers). Same terms, same phases."""
    job = _job(model, recipe, grid, gpu)
    reserve = np.where(grid.num_gpus > 1, runtime_reserve_bytes(gpu, 2), runtime_reserve_bytes(gpu, 1))
    out = _to_bytes(_stage_terms(job, _layer(job), _stage_at(job, rank, first, last)), reserve)
    out["stage"] = np.asarray(rank, dtype=np.int64) + np.zeros_like(out["total"])
    return out


__all__ = ["memory_for_stages"]
