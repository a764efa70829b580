"""Built-in strategies, installed as ``flexgraph.strategies``.

Each strategy is one module (``single_device``, ``ddp``, ``fsdp``,
``deepspeed``): a factory returning a :class:`flexgraph.Strategy` (its
rewrites) and the step functions only it knows. The runtime a single
strategy needs lives beside it: ``fsdp_units`` (which submodules FSDP shards,
or checkpoints the activations of, after MMEngine's wrap policies),
``deepspeed_engine`` (DeepSpeed's config, and its engine in MMEngine's shapes),
``deepspeed_checkpoint`` (DeepSpeed's checkpoints) and ``deepspeed_params``
(ZeRO-3's parameters a forward cannot get, named). The factories are
registered as entry points in the ``flexgraph.strategies`` group, so nothing
below the CLI imports this package.
"""
