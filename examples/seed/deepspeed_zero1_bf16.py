"""The ZeRO-1 seed config in bfloat16, which CPUs support: only the precision differs."""

_base_ = ["deepspeed_zero1_fp16.py"]

strategy = dict(fp16=dict(enabled=False), bf16=dict(enabled=True))
work_dir = "work_dirs/seed_deepspeed_zero1_bf16"
