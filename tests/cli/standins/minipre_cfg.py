"""A config in the shape of MMPreTrain's MAE fine-tuning ones, over minipre's stand-ins.

``load_from``-free: the backbone's weights come from ``init_cfg``'s checkpoint
(``PRETRAINED``, written by the test), the head's from ``TruncNormal``.
"""

default_scope = "minipre"
PRETRAINED = "pretrained.pth"

model = dict(
    type="TinyClassifier",
    backbone=dict(type="TinyBackbone", dims=16, depth=3, drop_path=0.2,
                  init_cfg=dict(type="Pretrained", checkpoint=PRETRAINED, prefix="backbone.")),
    head=dict(type="TinyHead", dims=16, num_classes=5,
              init_cfg=[dict(type="TruncNormal", layer="Linear", std=0.02)]))

train_pipeline = [dict(type="RandomJitter", scale=0.1), dict(type="PackTokens")]
train_dataloader = dict(
    batch_size=4, num_workers=0, collate_fn=dict(type="default_collate"),
    dataset=dict(type="TokenSet", length=64, pipeline=train_pipeline),
    sampler=dict(type="DefaultSampler", shuffle=True))
val_dataloader = dict(
    batch_size=8, num_workers=0, collate_fn=dict(type="default_collate"),
    dataset=dict(type="TokenSet", length=20, seed=1, pipeline=[dict(type="PackTokens")]),
    sampler=dict(type="DefaultSampler", shuffle=False))
val_evaluator = dict(type="TinyAccuracy")

optim_wrapper = dict(
    optimizer=dict(type="AdamW", lr=4e-3, weight_decay=0.05, betas=(0.9, 0.999)),
    constructor="TinyLayerDecayConstructor",
    paramwise_cfg=dict(layer_decay_rate=0.75))
param_scheduler = [
    dict(type="LinearLR", start_factor=1e-2, by_epoch=True, begin=0, end=1,
         convert_to_iter_based=True),
    dict(type="CosineAnnealingLR", T_max=1, by_epoch=True, begin=1, end=2, eta_min=1e-6,
         convert_to_iter_based=True),
]
train_cfg = dict(by_epoch=True, max_epochs=2, val_interval=1)
val_cfg = dict()
default_hooks = dict(checkpoint=dict(type="CheckpointHook", interval=1),
                     logger=dict(type="LoggerHook", interval=4))
custom_hooks = [dict(type="Snapshot")]
randomness = dict(seed=0, diff_rank_seed=True)
