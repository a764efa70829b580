"""Quickstart: an MLP on scikit-learn's digits, MMEngine-style config.

Run it with ``flexgraph run examples/quickstart.py``. It trains for 20 epochs
(900 iterations) and reaches validation accuracy >= 0.95 (0.98 measured with
seed 0: accuracy/top1 = 0.9805) in about 2 s of training, under 10 s end to end
with imports, on 2 CPU cores; tests/training/test_quickstart.py checks the 0.95.

Everything here is plain MMEngine config: components are named by registry
``type`` (registered in ``digits.py``, imported via ``custom_imports``; the
folder of this file is importable when flexgraph loads it).
"""

custom_imports = dict(imports=["digits"], allow_failed_imports=False)

model = dict(type="DigitsMLP", hidden=128, dropout=0.1)

train_dataloader = dict(
    batch_size=32,
    num_workers=0,
    dataset=dict(type="DigitsDataset", split="train"),
    sampler=dict(type="DefaultSampler", shuffle=True),
)
val_dataloader = dict(
    batch_size=128,
    num_workers=0,
    dataset=dict(type="DigitsDataset", split="val"),
    sampler=dict(type="DefaultSampler", shuffle=False),
)
val_evaluator = dict(type="DigitsAccuracy")

optim_wrapper = dict(optimizer=dict(type="AdamW", lr=3e-3, weight_decay=1e-4))
param_scheduler = [
    dict(type="CosineAnnealingLR", by_epoch=True, eta_min=1e-5, convert_to_iter_based=True),
]

train_cfg = dict(by_epoch=True, max_epochs=20, val_interval=5)
val_cfg = dict()

default_hooks = dict(
    checkpoint=dict(type="CheckpointHook", interval=10, max_keep_ckpts=2),
    logger=dict(type="LoggerHook", interval=50),
)
randomness = dict(seed=0)
# metrics.jsonl is always written; TensorBoard scalars (<run folder>/vis_data) on request.
visualizer = dict(type="Visualizer",
                  vis_backends=[dict(type="LocalVisBackend"), dict(type="TensorboardVisBackend")])

# One process by default, DDP with --nproc-per-node 2. To shard instead, run
# with --nproc-per-node 2 after uncommenting one of:
# strategy = dict(type="FSDPStrategy")
# strategy = dict(type="DeepSpeedStrategy", bf16=dict(enabled=True),
#                 zero_optimization=dict(stage=3))
# strategy = dict(type="DDPStrategy")
work_dir = "work_dirs/quickstart"
