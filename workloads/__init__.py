"""What runs and how it is parallelised: models (``models``, ``hf_config``), kernels
(``kernels``; the shared kinds and constructors: ``kernel_types``; the
attention block's: ``attention_kernels``; norms, rotary embedding,
bias-dropout-add, activations and the loss at their kernels' bytes:
``elementwise_kernels``), the optimizer step's kernels (``optimizer_step``),
how a model is trained (``training``, ``frameworks``, ``precision``; what
Megatron-Core's CUDA graph scopes capture: ``cuda_graphs``), memory
(``memory``, ``stage_memory``), schedules (``schedules``, ``dualpipe``,
``moe_overlap``), Megatron-Core's pipeline layout string
(``pipeline_layout``), rank layout (``layout``), gradient buckets
(``buckets``), MoE token routing (``routing``), offloading (``offload``),
recompute by module (``recompute``), multi-token prediction (``mtp``), one
module per parallel strategy (``strategies``), the builder's state (``stage``),
a layer's pass and a chunk's layers (``layer_passes``), the program builder
(``program``) and its copying of steps (``stamping``), background traffic
(``background``) and several jobs' programs merged (``jobs``).

Pure Python: it may import ``simulator.base`` only (no SimPy, no ``topologies``);
the output is a ``simulator.base.ir.Program``.
"""
