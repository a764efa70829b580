"""A ViT-shaped classifier: patch embedding, class token, residual blocks, a linear head.

No attention: the blocks are per-token MLPs, and the average over tokens (with the
class token) is what the head sees.
"""

import torch
from mmengine.model import BaseModel, BaseModule
from torch import nn

from minipre.registry import MODELS

try:  # the lazy import must not run under ZeRO-3's patched tensor constructors
    from deepspeed.runtime.zero import partition_parameters
except ImportError:
    partition_parameters = None
if partition_parameters is not None and partition_parameters.zero_init_context:
    raise ImportError("minipre.models was imported inside deepspeed.zero.Init")


@MODELS.register_module()
class TinyBackbone(BaseModule):
    def __init__(self, in_dims=12, dims=16, depth=3, drop_path=0.2, init_cfg=None):
        super().__init__(init_cfg)
        self.patch_embed = nn.Linear(in_dims, dims)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dims))  # set by init_weights only
        self.layers = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(dims), nn.Linear(dims, dims), nn.GELU())
            for _ in range(depth))
        self.ln1 = nn.LayerNorm(dims)
        self.drop_path = drop_path

    def init_weights(self):
        super().init_weights()
        if not (isinstance(self.init_cfg, dict) and self.init_cfg.get("type") == "Pretrained"):
            nn.init.trunc_normal_(self.cls_token, std=0.02)

    def forward(self, tokens):
        x = self.patch_embed(tokens)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        for layer in self.layers:
            update = layer(x)
            if self.training and self.drop_path:  # random depth, from the global RNG
                keep = (torch.rand(x.shape[0], 1, 1) > self.drop_path).to(x.dtype)
                update = update * keep / (1 - self.drop_path)
            x = x + update
        return self.ln1(x).mean(dim=1)  # MAE fine-tuning's out_type='avg_featmap'


@MODELS.register_module()
class TinyHead(BaseModule):
    def __init__(self, dims=16, num_classes=5, init_cfg=None):
        super().__init__(init_cfg)
        self.fc = nn.Linear(dims, num_classes)

    def forward(self, features):
        return self.fc(features)


@MODELS.register_module()
class TinyClassifier(BaseModel):
    def __init__(self, backbone, head, data_preprocessor=None, init_cfg=None):
        super().__init__(data_preprocessor=data_preprocessor, init_cfg=init_cfg)
        self.backbone = MODELS.build(backbone)
        self.head = MODELS.build(head)

    def forward(self, inputs, data_samples=None, mode="tensor"):
        logits = self.head(self.backbone(inputs))
        if mode == "loss":
            return {"loss": nn.functional.cross_entropy(logits, data_samples)}
        if mode == "predict":
            return list(zip(logits.argmax(-1).tolist(), data_samples.tolist(), strict=True))
        return logits
