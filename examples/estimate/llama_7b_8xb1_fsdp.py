"""A 7B Llama-style decoder, 4096-token sequences, one per GPU, FSDP + bf16 on 8 GPUs.

    flexgraph plan examples/estimate/llama_7b_8xb1_fsdp.py --estimate --world-size 8
    flexgraph plan examples/estimate/llama_7b_8xb1_fsdp.py --world-size 8 \\
        --compare ddp:bf16,deepspeed:zero2:bf16,fsdp:bf16,deepspeed:zero3:bf16
"""

custom_imports = dict(imports=["llama_sized"], allow_failed_imports=False)

model = dict(type="SizedLlama")
train_dataloader = dict(
    batch_size=1, num_workers=4,
    dataset=dict(type="RandomTokens", seq_len=4096),
    sampler=dict(type="DefaultSampler", shuffle=True))
optim_wrapper = dict(optimizer=dict(type="AdamW", lr=3e-4, weight_decay=0.1),
                     clip_grad=dict(max_norm=1.0))
train_cfg = dict(by_epoch=False, max_iters=1000)
strategy = dict(
    type="FSDPStrategy",
    model_wrapper=dict(
        auto_wrap_policy=dict(type="torch.distributed.fsdp.wrap.transformer_auto_wrap_policy",
                              transformer_layer_cls=["DecoderLayer"]),
        mixed_precision=dict(param_dtype="bfloat16", reduce_dtype="float32")))
work_dir = "work_dirs/llama_7b_8xb1_fsdp"
