"""The ZeRO-3 seed config in bfloat16, which CPUs support: only the precision differs."""

_base_ = ["deepspeed_zero3_fp16.py"]

strategy = dict(fp16=dict(enabled=False), bf16=dict(enabled=True))
work_dir = "work_dirs/seed_deepspeed_zero3_bf16"
