"""MMPreTrain's FSDP recipe, unchanged, over the small digits ViT.

The strategy and optimizer wrapper lines are those of MMPreTrain's
``vit-huge-p14_8xb128-fsdp-coslr-50e_in1k.py`` (only ``min_num_params`` is scaled
to this model): a size-based auto-wrap policy picks the units to shard, and
``AmpOptimWrapper`` trains in mixed precision (bfloat16 on the CPU).

    flexgraph run examples/vit_fsdp.py --nproc-per-node 2
"""

_base_ = ["vit_digits.py"]

strategy = dict(
    type="FSDPStrategy",
    model_wrapper=dict(
        auto_wrap_policy=dict(
            type="torch.distributed.fsdp.wrap.size_based_auto_wrap_policy",
            min_num_params=1e4)))

optim_wrapper = dict(type="AmpOptimWrapper")

work_dir = "work_dirs/vit_fsdp"
