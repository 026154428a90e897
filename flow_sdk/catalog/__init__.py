"""Static data about hardware: GPU models (here) and, per provider, instance offers."""

from flow_sdk.catalog.gpus import GPU_MODELS, GpuModel, find_gpu_model

__all__ = ["GPU_MODELS", "GpuModel", "find_gpu_model"]
