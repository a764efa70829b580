"""Built-in strategies, installed as ``flexgraph.strategies``.

A strategy is a factory returning a :class:`flexgraph.Strategy` (its
rewrites) and the step functions only it knows. The factories are registered
as entry points in the ``flexgraph.strategies`` group, so nothing below the
CLI imports this package. The modules:

``names``
    Each strategy's names in one table: its registry name, MMEngine's type
    name for it (an alias), its factory and its memory model.
``common``
    What more than one strategy uses: the rewrite that joins the process
    group, ``checkpoint_format``'s rewrite, the errors for refused options
    and stages.
``single_device``, ``single_device_memory``
    One process, one device; its memory model.
``ddp``, ``ddp_memory``
    DistributedDataParallel (factory and its one step function); its memory
    model.
``fsdp``
    FSDP2, a package. Its face is the factory; behind it ``fsdp.options``
    (MMEngine's options translated), ``fsdp.steps`` (its step functions),
    ``fsdp.units`` (which submodules are sharded, or checkpointed, after
    MMEngine's wrap policies) and ``fsdp.memory``.
``deepspeed``
    DeepSpeed ZeRO, a package. Its face is the factory; behind it
    ``deepspeed.options`` (the options as one DeepSpeed config),
    ``deepspeed.steps`` (its step functions), ``deepspeed.engine`` (the config
    completed at run time, the engine in MMEngine's shapes),
    ``deepspeed.checkpoint`` (DeepSpeed's own checkpoints, read safely, and
    the opener of ``load_from``: the ``flexgraph.checkpoint_openers`` entry
    point), ``deepspeed.state`` (portable checkpoints: the state by parameter
    name), ``deepspeed.params`` (ZeRO-3's parameters a forward cannot get,
    named), ``deepspeed.inspect`` (``flexgraph ckpt inspect`` of DeepSpeed's
    directories: the ``flexgraph.checkpoint_inspectors`` entry point) and
    ``deepspeed.memory``.

A memory model (``flexgraph plan --estimate``) is a module with
``candidate_options`` and ``estimate_memory``, named by the strategy's
``memory_model`` and imported only to estimate, so planning stays free of torch.
"""
