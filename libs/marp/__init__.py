"""MARP: memory-aware resource planning for LLM training jobs (Frenzy's predictor library).

Given a model (catalog name or HF-style config) and a training recipe, MARP
predicts the per-GPU peak training memory of any parallel layout
(``predict_memory``) and enumerates, ranks and explains the resource plans that
fit each GPU type (``enumerate_plans``). Pure library: no network, no Redis.
"""

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
