"""Tensor parallelism on torch.distributed (gloo on CPU, NCCL on CUDA).

    LLM(tensor_parallel_size=3)   # rank 0 here, ranks 1..2 in worker processes (forked where safe)

- group.py     process-group setup (a free localhost port, or torchrun's env)
- comm.py      all-reduce / all-gather with a byte counter (feeds the step trace)
- shard.py     which rank holds which heads, rows and columns; shard_model()
- layers.py    row-parallel linear, vocab-parallel embedding and LM head
- worker.py    ranks 1..N-1: load, shard, own a paged KV pool, run each step rank 0 broadcasts
- executor.py  rank 0's side: TensorParallelExecutor / PipelineParallelExecutor, the engine's Executor
               (engine/executor.py) for world_size > 1
- analytic.py  a speed-up model of TP over NVLink vs PCIe
- pipeline.py  pipeline parallelism instead: the layers split into stages (LLM(pipeline_parallel_size=2))
- torchrun.py  ranks started by torchrun (multi-node): its env, the worker loop of ranks != 0
- torchrun_executor.py  rank 0's executor over those ranks (start-up, health and shutdown by collectives)
- launch.py    make_parallel_executor(model, config): local workers or torchrun's ranks; the CLI hook
"""
