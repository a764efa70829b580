"""ViT-huge/14 at 224 px, batch 128 per GPU: the model of MMEngine's FlexibleRunner PR #1183.

Its table (8 x A100 80 GB): DDP fp32 runs out of memory, DDP + fp16 takes 58 GB,
DeepSpeed ZeRO-1 + fp16 44 GB. Compare the strategies before touching a GPU::

    flexgraph plan examples/estimate/vit_huge_p14_8xb128_ddp.py --compare \\
        ddp,ddp:fp16,deepspeed:zero1:fp16,deepspeed:zero3:fp16 --world-size 8 \\
        --device-memory 80GB
"""

custom_imports = dict(imports=["vit_sized"], allow_failed_imports=False)

model = dict(
    type="SizedViT", arch="huge", img_size=224, patch_size=14, num_classes=1000,
    data_preprocessor=dict(type="ImgDataPreprocessor", mean=[123.675, 116.28, 103.53],
                           std=[58.395, 57.12, 57.375], bgr_to_rgb=True))

train_dataloader = dict(
    batch_size=128, num_workers=8, persistent_workers=True,
    dataset=dict(type="SyntheticImages", size=224),
    sampler=dict(type="DefaultSampler", shuffle=True))

optim_wrapper = dict(optimizer=dict(type="AdamW", lr=1e-3, weight_decay=0.3),
                     clip_grad=dict(max_norm=1.0))
train_cfg = dict(by_epoch=True, max_epochs=50)
strategy = dict(type="DDPStrategy")
work_dir = "work_dirs/vit_huge_p14_8xb128"
