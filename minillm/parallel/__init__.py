"""Tensor parallelism on torch.distributed (gloo on CPU, NCCL on CUDA).

    LLM(tensor_parallel_size=3)   # rank 0 here, ranks 1..2 in spawned worker processes

- group.py     process-group setup (a free localhost port, or torchrun's env)
- comm.py      all-reduce / all-gather with a byte counter (feeds the step trace)
- shard.py     which rank holds which heads, rows and columns; shard_model()
- layers.py    row-parallel linear, vocab-parallel embedding and LM head
- batch.py     the step's batch as broadcast from rank 0, and the forward all ranks run
- worker.py    ranks 1..N-1: load, shard, own a paged KV pool, follow rank 0
- executor.py  rank 0's side: same interface as ModelRunner.run
- analytic.py  a speed-up model of TP over NVLink vs PCIe
- pipeline.py  pipeline parallelism instead: the layers split into stages (LLM(pipeline_parallel_size=2))
"""
