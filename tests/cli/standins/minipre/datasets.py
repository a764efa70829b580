"""Token sequences whose class shows in their mean; a transform that draws from numpy."""

import numpy as np
import torch
from mmengine.dataset import BaseDataset

from minipre.registry import DATASETS, TRANSFORMS


@TRANSFORMS.register_module()
class RandomJitter:
    """Adds numpy noise, as image augmentations draw theirs."""

    def __init__(self, scale=0.1):
        self.scale = scale

    def __call__(self, results):
        noise = np.random.normal(0.0, self.scale, results["inputs"].shape)
        results["inputs"] = results["inputs"] + torch.from_numpy(noise).float()
        return results


@DATASETS.register_module()
class TokenSet(BaseDataset):
    def __init__(self, length=64, tokens=4, in_dims=12, classes=5, seed=0, **kwargs):
        self.shape, self.classes, self.length, self.seed = (tokens, in_dims), classes, length, seed
        super().__init__(**kwargs)

    def load_data_list(self):
        generator = torch.Generator().manual_seed(self.seed)
        data = []
        for i in range(self.length):
            label = i % self.classes
            inputs = torch.randn(*self.shape, generator=generator) * 0.5 + label / self.classes
            data.append({"inputs": inputs, "data_samples": label})
        return data


@TRANSFORMS.register_module()
class PackTokens:
    """What the model takes (MMPreTrain's PackInputs): inputs and the label."""

    def __call__(self, results):
        return {"inputs": results["inputs"], "data_samples": results["data_samples"]}
