"""The ``training`` and ``parallelism`` sections, checked by the specs they
configure (``TrainingSpec``, ``ParallelSpec`` and ``FsdpSpec``'s settings), and
the layout checks of the parallel strategies (``workloads.program.check``)."""

from __future__ import annotations

from dataclasses import replace

from simulator.base import footprint
from simulator.base.fields import ScenarioError, fail, integer, schema_of, section
from simulator.compute.attention import FP8_KERNELS, available, resolve
from topologies import GpuSpec
from workloads import cuda_graphs
from workloads.frameworks import Framework
from workloads.memory import Recompute
from workloads.models import ModelSpec
from workloads.precision import LOW, PRECISIONS, RECIPES, is_low
from workloads.program import LayoutError, check
from workloads.schedules import ScheduleError
from workloads.training import ParallelSpec, TrainingSpec

TRAINING_SCHEMA = schema_of(TrainingSpec)
PARALLEL_SCHEMA = {**schema_of(ParallelSpec), "dp": (integer(1), None)}  # dp: what is left


def training_from(raw: object, gpu: GpuSpec, timed: bool = True) -> TrainingSpec:
    """Check a ``training:`` section for ``gpu`` and build its TrainingSpec.
    ``timed``: the compute model times the kernels on ``gpu``, which must then
    run the precision and kernels asked for; traces replayed with their recorded
    durations (``workload.durations: recorded``) need none of it."""
    training = TrainingSpec(**section("training", raw, TRAINING_SCHEMA))
    if not timed:
        return recompute_from(training)
    if training.precision not in gpu.peak_flops:
        raise fail("training.precision", training.precision,
                   f"is not supported by {gpu.name} (it has "
                   f"{', '.join(p for p in PRECISIONS if p in gpu.peak_flops)})")
    check_low_precision(training, gpu)
    training = attention_kernel_from(training, raw, gpu)
    check_fp8_attention(training, gpu)
    training = recompute_from(training)
    return replace(training, fp8_transposes=training.recipe is not None
                   and not training.recipe.block and gpu.architecture == "hopper")


def attention_kernel_from(training: TrainingSpec, raw: object, gpu: GpuSpec) -> TrainingSpec:
    """``training.attention_kernel`` checked against ``flash_attention`` and the
    GPU: ``unfused`` is ``flash_attention: false``; a fused kernel needs rows
    that time it on this GPU (``simulator.compute.attention``)."""
    kernel = training.attention_kernel
    written = isinstance(raw, dict) and "flash_attention" in raw
    if kernel == "unfused":
        if written and training.flash_attention:
            raise fail("training.attention_kernel", kernel, "contradicts training."
                       "flash_attention: true; leave one of them out")
        return replace(training, flash_attention=False)
    if kernel != "auto" and not training.flash_attention:
        raise fail("training.attention_kernel", kernel, "is a fused kernel, but training."
                   "flash_attention is false; use attention_kernel: unfused")
    if kernel == "flash3" and gpu.architecture != "hopper":
        raise fail("training.attention_kernel", kernel, f"runs on Hopper GPUs only, not "
                   f"{gpu.name}")
    if kernel not in ("auto", *available(gpu)):
        raise fail("training.attention_kernel", kernel, f"has no published rows for "
                   f"{gpu.name} (simulator.compute.attention); it has: "
                   f"{', '.join(available(gpu)) or 'none'} (or auto, unfused)")
    return training


def check_fp8_attention(training: TrainingSpec, gpu: GpuSpec) -> None:
    """FP8 attention only on a kernel with an FP8 path (``FP8_KERNELS``), however
    the kernel was chosen (``attention_kernel``, ``flash_attention: false``, or
    ``auto``: Transformer Engine's FP8 kernel, ``compute.attention.resolve``); a
    GPU without attention rows ("") is timed by its file's FP8 efficiency."""
    if not training.fp8_attention:
        return
    kernel = resolve(training.attention_kernel, "", gpu, training.flash_attention, fp8=True)
    if kernel not in (*FP8_KERNELS, ""):
        usable = [k for k in FP8_KERNELS if k in available(gpu)] or list(FP8_KERNELS)
        raise fail("training.fp8_attention", True, "needs fused attention with an FP8 path "
                   f"(training.attention_kernel: {' or '.join(usable)}), not {kernel} "
                   f"on {gpu.name}")


def recompute_from(training: TrainingSpec) -> TrainingSpec:
    """``recompute_modules`` makes the recompute selective (as Megatron-Bridge
    sets the granularity when modules are given); a full recompute has none."""
    if not training.recompute_modules:
        return training
    if training.recompute is Recompute.FULL:
        raise fail("training.recompute_modules", list(training.recompute_modules),
                   "applies to a selective recompute, not recompute: full; leave one out")
    return replace(training, recompute=Recompute.SELECTIVE)


def check_low_precision(training: TrainingSpec, gpu: GpuSpec) -> None:
    """The low-precision keys' rules: a recipe of the precision's format that the
    GPU runs, FP8 attention fused, FP8 parameters in an FP8 format."""
    low = is_low(training.precision)
    for key in ("fp8_recipe", "fp8_attention", "fp8_param_gather"):
        if getattr(training, key) not in (None, False) and not low:
            raise fail(f"training.{key}", getattr(training, key),
                       f"needs a low training.precision ({', '.join(LOW)}), not "
                       f"{training.precision}")
    if not low:
        return
    recipe = training.recipe
    if recipe.precision != training.precision:
        fits = [r for r, v in RECIPES.items() if v.precision == training.precision]
        raise fail("training.fp8_recipe", recipe.name,
                   f"is a recipe of precision {recipe.precision}; with training.precision "
                   f"{training.precision} use {' or '.join(fits)}")
    if not recipe.hopper and gpu.architecture in ("hopper", "ampere"):
        raise fail("training.fp8_recipe", recipe.name, f"needs a Blackwell GPU, not {gpu.name}")
    if training.precision not in gpu.low_precision or "cast" not in gpu.low_precision:
        raise fail("training.precision", training.precision, f"has no low_precision."
                   f"{training.precision} efficiency in {gpu.name}'s GPU file")
    if training.fp8_attention and "fp8_attention" not in gpu.low_precision:
        raise fail("training.fp8_attention", True, "has no low_precision.fp8_attention "
                   f"efficiency in {gpu.name}'s GPU file")


def parallel_from(raw: object, gpus: int, ranks_per_node: int,
                  ranks_per_domain: int | None = None) -> ParallelSpec:
    """Check a ``parallelism:`` section on ``gpus`` GPUs and build its ParallelSpec
    (``ranks_per_domain``: consecutive ranks sharing an NVLink domain, a server's
    unless given)."""
    p = section("parallelism", raw, PARALLEL_SCHEMA)
    tp, cp, pp = p["tp"], p["cp"], p["pp"]
    if p["fsdp"] is not None and p["zero"]:
        raise fail("parallelism.fsdp", raw["fsdp"], "cannot be combined with parallelism.zero; "
                                                   "FSDP sets its own sharding")
    if p["fsdp"] is not None and "framework" not in raw:
        p["framework"] = Framework.PYTORCH  # FSDP is PyTorch's: its defaults, unless told
    if p["deepspeed"] is not None and p["framework"] is not Framework.DEEPSPEED:
        raise fail("parallelism.deepspeed", raw["deepspeed"], "needs parallelism.framework: "
                                                           "deepspeed")
    model_parallel = tp * cp * pp
    if gpus % model_parallel:
        raise ScenarioError(f"parallelism: tp x cp x pp = {tp} x {cp} x {pp} = {model_parallel} "
                            f"must divide the GPU count {gpus}")
    dp = p["dp"] if p["dp"] is not None else gpus // model_parallel
    if gpus % dp:
        raise fail("parallelism.dp", dp, f"must divide the GPU count {gpus} "
                                          "(cluster.nodes x gpus_per_node)")
    if model_parallel * dp != gpus:
        raise ScenarioError(f"parallelism: tp x cp x pp x dp = {tp} x {cp} x {pp} x {dp} = "
                            f"{model_parallel * dp} must equal the GPU count {gpus}")
    return ParallelSpec(**{**p, "dp": dp}, ranks_per_node=ranks_per_node,
                        ranks_per_domain=min(gpus, ranks_per_domain or ranks_per_node))


EXPERT_KEYS = ("ep", "etp", "moe_token_dispatcher_type")  # parallelism keys of MoE layers


def check_layout(model: ModelSpec, training: TrainingSpec, parallel: ParallelSpec,
                 raw_parallel: object = None) -> None:
    """The layout's own rules (``workloads.program.check``), after refusing one too
    large to build at all (checking it builds its pipeline schedule); an expert
    key given (``raw_parallel``: the section as written) needs experts."""
    given = [k for k in EXPERT_KEYS if isinstance(raw_parallel, dict) and k in raw_parallel]
    if given and model.experts == 0:
        raise fail(f"parallelism.{given[0]}", raw_parallel[given[0]],
                   "needs a model with experts (model.experts > 0)")
    footprint.check_layout(model.layers, parallel.micro_batches(training))
    check_cuda_graphs(model, training)
    try:
        check(model, training, parallel)
    except (LayoutError, ScheduleError) as error:
        raise ScenarioError(str(error) if str(error).startswith(("model.", "training.",
                                                                 "parallelism"))
                            else f"parallelism.schedule: {error}") from None


def check_cuda_graphs(model: ModelSpec, training: TrainingSpec) -> None:
    """``training.cuda_graph_scope`` needs ``cuda_graphs: true`` and a scope that
    Megatron-Core allows for this model (``workloads.cuda_graphs.refusal``)."""
    scope = training.cuda_graph_scope
    if scope and not training.cuda_graphs:
        raise fail("training.cuda_graph_scope", list(scope),
                   "needs training.cuda_graphs: true (without graphs nothing is captured)")
    if not training.cuda_graphs:
        return
    moe = model.experts > 0
    why = cuda_graphs.refusal(
        scope, moe, any(not model.is_moe_layer(n) for n in range(model.layers)),
        model.capacity_factor is None, training.recompute is Recompute.FULL,
        training.activation_offload_layers > 0)
    if why:
        raise fail("training.cuda_graph_scope", list(scope) or ["full"], why)
