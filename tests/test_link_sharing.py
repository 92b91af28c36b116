"""``engine.link_sharing``: which calls run alone, on hand-made programs (the
equivalence with the reference core is in ``test_engine_plugins``)."""

from simulator.base.ir import Collective, Op, OpKind, Phase
from simulator.engine.link_sharing import alone_calls, one_at_a_time

F = Phase.FORWARD


def kernel(*deps: int) -> Op:
    return Op(OpKind.COMPUTE, "k", "compute", F, deps)


def call(group: str, stream: str, *deps: int) -> Op:
    return Op(OpKind.COLLECTIVE, f"{group} call", stream, F, deps,
              collective=Collective.ALL_REDUCE, group=group)


class _Program:
    def __init__(self, ops):
        self.ops = (tuple(ops),)


def test_calls_each_waiting_for_the_one_before_run_one_at_a_time():
    # kernel 0 -> tp 1 -> kernel 2 -> cp 3 -> kernel 4 -> tp 5
    ops = [kernel(), call("tp", "tp", 0), kernel(1), call("cp", "cp", 2), kernel(3),
           call("tp", "tp", 4)]
    assert one_at_a_time(_Program(ops), {"tp", "cp"})


def test_a_call_beside_another_is_not_one_at_a_time():
    # the cp call waits for kernel 0 only, so it can run with the tp call 1
    ops = [kernel(), call("tp", "tp", 0), call("cp", "cp", 0), kernel(1, 2)]
    assert not one_at_a_time(_Program(ops), {"tp", "cp"})


def test_only_calls_a_reduction_may_overlap_leave_the_alone_path():
    # a pipeline's drain: tp 1 (before any reduction), then a dp reduction 3 that
    # starts after kernel 2 and runs beside tp 4 and kernel 5, then tp 7 after the
    # reduction ended (kernel 6 waits for it)
    ops = [kernel(), call("tp", "tp", 0), kernel(1), call("dp", "dp", 2),
           call("tp", "tp", 2), kernel(4), kernel(5, 3), call("tp", "tp", 6)]
    assert alone_calls(ops, frozenset({"tp"}), frozenset({"dp"})) == [4]


def test_no_late_dimension_means_every_call_runs_alone():
    ops = [kernel(), call("tp", "tp", 0), call("dp", "dp", 0)]
    assert alone_calls(ops, frozenset({"tp"}), frozenset()) == []


def test_late_messages_keep_every_call_on_the_network():
    # a message may arrive before its receiver waits for it: nothing is ordered
    send = Op(OpKind.SEND, "send", "pp", F, (0,), group="pp.f0")
    ops = [kernel(), send, call("tp", "tp", 1)]
    assert alone_calls(ops, frozenset({"tp"}), frozenset({"pp.f0"})) == [2]
