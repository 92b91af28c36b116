"""Issue 56, item 3: the dense overheads at their kernels' bytes (norms, rotary
embedding, bias-dropout-add, activations, the loss, gradient-accumulation
fusion, the optimizer step), each against the bytes derived by hand from the
framework's code (``workloads.elementwise_kernels``, ``workloads.optimizer_step``
cite the files), and a small model's program with them."""

from __future__ import annotations

import copy

import pytest

from simulator.base.fields import ScenarioError
from simulator.base.ir import OpKind, Phase
from simulator.compute.model import overheads
from simulator.config.scenario import from_dict
from tests.test_parallelism import TINY
from workloads import elementwise_kernels as E
from workloads import kernels as K
from workloads.frameworks import Framework
from workloads.models import MODELS
from workloads.optimizer_step import bytes_per_param, step_kernels
from workloads.program import build_program
from workloads.stage import kernel_cost
from workloads.training import TrainingSpec

T, H = 8192, 4096  # tokens and hidden of one micro-batch (Llama 3 8B at 8k)


def test_rmsnorm_and_layernorm_move_te_kernels_bytes():
    """RMSNorm forward: x read, y written (BF16), gamma read, one FP32 1/rms per
    row; backward: dy, x read, dx written, gamma read and dgamma written, the
    statistic read, 132 FP32 partial dgamma rows written and read back.
    LayerNorm: beta and the mean besides."""
    rms = E.norm("ln1", T, H, 2, layer_norm=False)
    assert rms.bytes == 2 * (2 * T * H + H) + 4 * T
    assert rms.backward_bytes == 2 * (3 * T * H + 2 * H) + 4 * T + 2 * 4 * 132 * H
    ln = E.norm("ln1", T, H, 2, layer_norm=True)
    assert ln.bytes == 2 * (2 * T * H + 2 * H) + 2 * 4 * T
    assert ln.backward_bytes == 2 * (3 * T * H + 4 * H) + 2 * 4 * T + 2 * 4 * 132 * 2 * H
    assert (rms.params, ln.params) == (H, 2 * H)
    # the backward reads three tensors and writes one where twice the forward said four
    assert rms.backward_bytes / rms.bytes == pytest.approx(1.5, rel=0.05)


def test_rotary_embedding_on_queries_and_keys():
    """TE's fused RoPE on this rank's q (32 heads / tp) and k (8 KV heads / tp),
    read and written, plus the FP32 frequencies once a call; backward alike."""
    model = MODELS["llama3-8b"]
    sh = K.Shard(1, T, tp=2)
    (rope,) = [k for k in K.layer_kernels(model, sh) if k.name == "rope"]
    q, kv = 16 * 128, 4 * 128
    assert rope.bytes == rope.backward_bytes == 2 * 2 * T * (q + kv) + 2 * 4 * T * 128
    gpt = K.layer_kernels(MODELS["gpt3-1.3b"], K.Shard(1, 2048))
    assert "rope" not in {k.name for k in gpt}  # learned positions: no rotary embedding


def test_bias_dropout_add_and_the_residual_gradient():
    """No bias, no dropout: forward out = x + residual (two reads, one write);
    backward only the add of the fork's two gradients. Dropout > 0 writes the
    one-byte mask and its backward reads it with dout and writes dx; a bias is
    read forward and its gradient sums dx backward."""
    n = T * H
    plain = E.bias_dropout_add("residual1", n, H, 2, bias=False, dropout=0.0)
    assert (plain.bytes, plain.backward_bytes) == (3 * 2 * n, 3 * 2 * n)
    gpt = E.bias_dropout_add("residual1", n, H, 2, bias=True, dropout=0.1)
    assert gpt.bytes == 2 * (3 * n + H) + n
    assert gpt.backward_bytes == 3 * 2 * n + (2 * 2 * n + n) + 2 * (n + H)


def test_activations_forward_and_backward():
    """Megatron's fused SwiGLU: [t, 2f] in, [t, f] out; swiglu_back reads dy
    [t, f] and the input [t, 2f], writes [t, 2f]. GeLU with bias: [t, f] and the
    bias in, [t, f] out; bias_gelu_back reads dy and x, writes dx, and the
    bias's gradient reads dx once more."""
    f = 14336
    swiglu = E.activation("act", T, f, 2, gated=True, bias=False)
    assert (swiglu.bytes, swiglu.backward_bytes) == (2 * 3 * T * f, 2 * 5 * T * f)
    gelu = E.activation("act", T, f, 2, gated=False, bias=True)
    assert gelu.bytes == 2 * (2 * T * f + f)
    assert gelu.backward_bytes == 2 * (4 * T * f + f)
    layer = K.layer_kernels(MODELS["llama3-8b"], K.Shard(1, T, tp=4))
    act = next(k for k in layer if k.name == "act")
    assert act.bytes == 2 * 3 * T * f / 4  # this rank's quarter of the width


def test_the_cross_entropy_passes():
    """Megatron-Core's unfused vocabulary-parallel cross entropy, pass by pass
    (tensor_parallel/cross_entropy.py): cast, max, subtract, exp, sum, divide;
    backward the multiply and the cast back. Fused: three kernels and one."""
    unfused = (2 + 4) + 4 + (4 + 4) + (4 + 4) + 4 + (4 + 4)
    assert unfused == E.UNFUSED_LOSS_FORWARD
    assert E.UNFUSED_LOSS_BACKWARD == (4 + 4) + (4 + 2)
    assert E.FUSED_LOSS_FORWARD == (2 + 4) + (4 + 4) + (4 + 4)
    assert E.FUSED_LOSS_BACKWARD == 4 + 2
    model = MODELS["llama3-8b"]
    loss = K.head_kernels(model, K.Shard(1, T, tp=2), vocab=128256)[-1]
    assert loss.bytes == 22 * T * 128256 // 2
    unfused_head = K.head_kernels(model, K.Shard(1, T, tp=2, fused_loss=False), vocab=128256)
    assert unfused_head[-1].backward_bytes == 14 * T * 128256 // 2


def test_gradient_accumulation_fusion_reads_and_writes_the_fp32_main_grad():
    """A Megatron run's weight-gradient GEMM accumulates into the FP32 main_grad
    (read and written: 8 bytes a weight) where a plain backward writes its BF16
    gradient (2): 6 more bytes a weight, FLOPs unchanged."""
    model = MODELS["llama3-8b"]
    training = TrainingSpec(seq_len=T, global_batch=8, micro_batch=1)
    plain = next(k for k in K.layer_kernels(model, K.Shard(1, T)) if k.name == "fc2")
    fused = next(k for k in K.layer_kernels(model, K.Shard(1, T, main_grad_bytes=4))
                 if k.name == "fc2")
    flops, moved = kernel_cost(fused, True, training)
    assert flops == kernel_cost(plain, True, training)[0] == 2 * plain.flops
    assert moved == 2 * plain.bytes + 6 * 14336 * H


def test_optimizer_bytes_per_parameter():
    """Megatron's distributed optimizer: the l2 norm reads the FP32 gradient (4),
    FusedAdam reads p, g, m, v and writes p, m, v (28), the copy to the BF16
    model parameter reads 4 and writes 2; a BF16 gradient buffer adds its cast
    to FP32 (2 + 4). PyTorch steps the FP32 parameters and scales the
    gradients unconditionally (8) instead of copying them."""
    assert bytes_per_param(Framework.MEGATRON, 4, 2) == 4 + 28 + 6
    assert bytes_per_param(Framework.MEGATRON, 2, 2) == 6 + 4 + 28 + 6
    assert bytes_per_param(Framework.MEGATRON, 4, 1) == 4 + 28 + 5  # FP8 parameters
    assert bytes_per_param(Framework.PYTORCH, 4, 2) == 4 + 8 + 28
    adam = next(k for k in step_kernels(1e6, Framework.MEGATRON, 4, 2) if k.name == "optimizer")
    assert adam.bytes == 28e6


def _program(dp_nodes: int = 2, zero: int | None = None, **training):
    scenario = copy.deepcopy(TINY)
    scenario["cluster"]["nodes"] = dp_nodes
    if zero is not None:
        scenario.setdefault("parallelism", {})["zero"] = zero
    scenario["model"] = {"preset": "llama3-8b", "layers": 2}
    scenario["training"].update(seq_len=1024, global_batch=16, **training)
    s = from_dict(scenario)
    return s, build_program(s.model, s.training, s.parallel, s.seed)


def test_a_small_models_step_has_the_new_kernels():
    """Every layer has its rotary embedding; the step its gradient norm (with the
    norm's all-reduce over 16 replicas where ZeRO-1 shards the gradients; none
    under DDP, whose replicas each hold the whole norm), Adam over every
    parameter (1/dp of them: ZeRO-1's shards, or all) and the master-to-model
    copy; the summary's compute_model line names them."""
    ddp = [op.name for op in _program(zero=0)[1].ops[0] if op.phase is Phase.OPTIMIZER]
    assert ddp == ["grad_norm", "optimizer", "param_copy"]
    s, program = _program(zero=1)
    ops = program.ops[0]
    names = [op.name for op in ops]
    assert names.count("rope") == 2 * 2 * s.training.global_batch // s.parallel.dp
    step = [op for op in ops if op.phase is Phase.OPTIMIZER]
    assert [op.name for op in step] == ["grad_norm", "grad_norm_all_reduce", "optimizer",
                                        "param_copy"]
    params = program.notes["parameters"] / (s.parallel.dp if s.parallel.zero >= 1 else 1)
    adam = next(op for op in step if op.name == "optimizer")
    assert adam.bytes == pytest.approx(28 * params, rel=1e-9)
    line = overheads(ops)
    assert "rope" in line and "grad_norm + optimizer + param_copy" in line
    assert all(op.kind is OpKind.COMPUTE or op.name == "grad_norm_all_reduce" for op in step)


def test_hidden_dropout_writes_its_mask_and_is_checked():
    """training.hidden_dropout > 0 makes each bias-dropout-add write the mask;
    a probability of 1 or more is refused, naming the key."""
    plain = next(op for op in _program()[1].ops[0] if op.name == "residual1")
    dropped = next(op for op in _program(hidden_dropout=0.1)[1].ops[0] if op.name == "residual1")
    assert dropped.bytes == pytest.approx(plain.bytes * (1 + 1 / 6))  # 1 byte on 3 x 2
    with pytest.raises(ScenarioError, match="training.hidden_dropout"):
        _program(hidden_dropout=1.0)


def test_the_loss_all_reduces_over_tensor_parallel_ranks():
    """Megatron-Core's fused cross entropy all-reduces the FP32 maxima, then the
    target logits and exp-sums concatenated: two calls of 4 and 8 bytes a token
    (unfused: three of 4)."""
    scenario = copy.deepcopy(TINY)
    scenario["model"] = {"preset": "llama3-8b", "layers": 2}
    scenario["training"].update(seq_len=1024, global_batch=16)
    scenario["parallelism"] = {"tp": 2}
    s = from_dict(scenario)
    ops = build_program(s.model, s.training, s.parallel, s.seed).ops[0]
    loss = [n for n, op in enumerate(ops) if op.name == "loss" and op.phase is Phase.FORWARD][0]
    calls = [op.bytes for op in ops[loss + 1:loss + 3]]
    assert calls == [4 * 1024, 8 * 1024]
    assert [op.name for op in ops[loss + 1:loss + 3]] == ["all_reduce", "all_reduce"]
