"""FSDP with a size-based auto-wrap policy and AmpOptimWrapper (MMPreTrain's FSDP ViT recipe)."""

_base_ = ["../vit_fsdp.py"]

runner_type = "FlexibleRunner"
work_dir = "work_dirs/seed_fsdp"
