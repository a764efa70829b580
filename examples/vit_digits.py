"""A small ViT on digits (``digits_vit.py``), the base of the sharded-training examples.

``flexgraph run examples/vit_digits.py`` trains it on one process; the configs
that build on it change only the strategy (and the optimizer wrapper), as
MMPreTrain's FSDP and DeepSpeed configs do over their ViT base configs.
"""

_base_ = ["quickstart.py"]
custom_imports = dict(imports=["digits", "digits_vit"], allow_failed_imports=False)

model = dict(_delete_=True, type="DigitsViT", dim=64, depth=4, heads=4, patch=4)
optim_wrapper = dict(optimizer=dict(type="AdamW", lr=3e-3, weight_decay=0.05))
train_cfg = dict(by_epoch=True, max_epochs=10, val_interval=5)
work_dir = "work_dirs/vit_digits"
