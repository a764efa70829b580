from mmengine.evaluator import BaseMetric

from minipre.registry import METRICS


@METRICS.register_module()
class TinyAccuracy(BaseMetric):
    def process(self, data_batch, data_samples):
        self.results.extend(int(pred == label) for pred, label in data_samples)

    def compute_metrics(self, results):
        return {"accuracy": sum(results) / max(len(results), 1)}
