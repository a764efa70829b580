"""Layer-wise learning-rate decay, as mmpretrain's constructor: a param group per parameter."""

from mmengine.optim import DefaultOptimWrapperConstructor

from minipre.registry import OPTIM_WRAPPER_CONSTRUCTORS


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class TinyLayerDecayConstructor(DefaultOptimWrapperConstructor):
    def add_params(self, params, module, **kwargs):
        depth = len(module.backbone.layers)
        decay = self.paramwise_cfg.get("layer_decay_rate", 0.75)
        for name, param in module.named_parameters():
            if name.startswith("backbone.layers."):
                layer = int(name.split(".")[2]) + 1
            elif name.startswith("backbone."):
                layer = 0 if not name.startswith("backbone.ln1") else depth
            else:
                layer = depth + 1
            params.append({"params": [param], "param_name": name,
                           "lr": self.base_lr * decay ** (depth + 1 - layer),
                           "weight_decay": 0.0 if param.ndim == 1 else self.base_wd})
