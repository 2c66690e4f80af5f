"""MARP: memory-aware resource planning for LLM training jobs (Frenzy's predictor library).

Given a model (catalog name or HF-style config) and a training recipe, MARP
predicts the per-GPU peak training memory of any parallel layout
(``predict_memory``) and enumerates, ranks and explains the resource plans that
fit each GPU type (``enumerate_plans``). Pure library: no network, no Redis.
"""

# Names resolve on first use (PEP 562): `import marp` costs nothing until a name is read, so a
# command that only lists its options (`frenzy --help`) never loads numpy and the model.
from typing import TYPE_CHECKING

_HOME: dict[str, str] = {
    "GpuPool": "marp.plans",
    "GpuType": "marp.gpus",
    "InvalidLayoutError": "marp.errors",
    "InvalidRecipeError": "marp.errors",
    "Layout": "marp.recipe",
    "MarpError": "marp.errors",
    "MemoryBreakdown": "marp.memory",
    "ModelConfigError": "marp.errors",
    "ModelSpec": "marp.models",
    "Plan": "marp.plans",
    "PlanSet": "marp.plans",
    "TrainingRecipe": "marp.recipe",
    "UnknownGpuError": "marp.errors",
    "UnknownModelError": "marp.errors",
    "UnsupportedPrecisionError": "marp.errors",
    "enumerate_plans": "marp.plans",
    "estimate_step_time": "marp.perf",
    "get_gpu": "marp.gpus",
    "get_model": "marp.model_catalog",
    "gpu_from_nvml_name": "marp.gpus",
    "list_gpus": "marp.gpus",
    "list_models": "marp.model_catalog",
    "memory_grid": "marp.memory",
    "model_from_hf_config": "marp.hf_config",
    "model_from_json": "marp.hf_config",
    "model_state_bytes": "marp.memory",
    "predict_memory": "marp.memory",
    "resolve_model": "marp.hf_config",
}

if TYPE_CHECKING:  # what type checkers and editors see: the names as plain imports
    from marp.errors import (
        InvalidLayoutError,
        InvalidRecipeError,
        MarpError,
        ModelConfigError,
        UnknownGpuError,
        UnknownModelError,
        UnsupportedPrecisionError,
    )
    from marp.gpus import GpuType, get_gpu, gpu_from_nvml_name, list_gpus
    from marp.hf_config import model_from_hf_config, model_from_json, resolve_model
    from marp.memory import MemoryBreakdown, memory_grid, model_state_bytes, predict_memory
    from marp.model_catalog import get_model, list_models
    from marp.models import ModelSpec
    from marp.perf import estimate_step_time
    from marp.plans import GpuPool, Plan, PlanSet, enumerate_plans
    from marp.recipe import Layout, TrainingRecipe


def __getattr__(name: str) -> object:
    import importlib

    home = _HOME.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value  # once: later reads skip this function
        return value
    try:  # a submodule read as an attribute (marp.plans.DEFAULT_...), as a plain package allows
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError:
        raise AttributeError(f"module 'marp' has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))


__all__ = [
    "GpuPool",
    "GpuType",
    "InvalidLayoutError",
    "InvalidRecipeError",
    "Layout",
    "MarpError",
    "MemoryBreakdown",
    "ModelConfigError",
    "ModelSpec",
    "Plan",
    "PlanSet",
    "TrainingRecipe",
    "UnknownGpuError",
    "UnknownModelError",
    "UnsupportedPrecisionError",
    "enumerate_plans",
    "estimate_step_time",
    "get_gpu",
    "get_model",
    "gpu_from_nvml_name",
    "list_gpus",
    "list_models",
    "memory_grid",
    "model_from_hf_config",
    "model_from_json",
    "model_state_bytes",
    "predict_memory",
    "resolve_model",
]
