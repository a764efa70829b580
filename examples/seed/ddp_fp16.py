"""DDP with mixed precision: MMEngine's AmpOptimWrapper (bfloat16 autocast on a CPU)."""

_base_ = ["../vit_digits.py"]

strategy = dict(type="DDPStrategy")
optim_wrapper = dict(type="AmpOptimWrapper")

runner_type = "FlexibleRunner"
work_dir = "work_dirs/seed_ddp_fp16"
