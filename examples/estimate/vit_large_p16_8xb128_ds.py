"""ViT-large/16 at 224 px, batch 128 per GPU, DeepSpeed ZeRO-1 + fp16 (PR #1183: 21 GB).

    flexgraph plan examples/estimate/vit_large_p16_8xb128_ds.py --estimate --world-size 8
"""

_base_ = ["vit_huge_p14_8xb128_ddp.py"]

model = dict(arch="large", patch_size=16)
optim_wrapper = dict(type="DeepSpeedOptimWrapper")
strategy = dict(
    _delete_=True, type="DeepSpeedStrategy",
    fp16=dict(enabled=True, loss_scale=0, initial_scale_power=15),
    inputs_to_half=["inputs"],
    zero_optimization=dict(stage=1, allgather_partitions=True, reduce_scatter=True,
                           allgather_bucket_size=50000000, reduce_bucket_size=50000000,
                           overlap_comm=True, contiguous_gradients=True))
work_dir = "work_dirs/vit_large_p16_8xb128_ds"
