# cython: language_level=3
"""The rules graph_pass applies exactly as rdmadev's passes do, from their one definition
(_native/tf/pass/rules.h): the planner asks these instead of keeping a copy. rdmadev._core
hands them to it as graph_pass.native_rules.NativeRules (PLANNER_RULES)."""
from rdmadev._native.c_rules cimport (CrossesTasks, KernelDevice, TrustedOutput, kBoundAttr, kBranchMark,
                                      kRecvOps, kSendOps)

__all__ = ["SEND_OPS", "RECV_OPS", "BRANCH_MARK", "BOUND_ATTR", "crosses_tasks", "trusted_output",
           "kernel_device"]


cdef frozenset _names(const char* const* names):
    out = []
    while names[0] != NULL:
        out.append(names[0].decode())
        names += 1
    return frozenset(out)


#: Op names of a rendezvous pair's sending half, and of its receiving half.
SEND_OPS = _names(kSendOps)
RECV_OPS = _names(kRecvOps)
#: What the pass names the node between a conditional branch's value and the task it crosses to.
BRANCH_MARK = kBranchMark.decode()
#: The attr the pass writes on a pair's halves with a bound on a run-time shape.
BOUND_ATTR = kBoundAttr.decode()


def crosses_tasks(str send_device, str recv_device):
    """Whether a pair from `send_device` to `recv_device` joins two tasks."""
    return CrossesTasks(send_device.encode(), recv_device.encode())


def trusted_output(str op, int index):
    """False where TF's shape function for output `index` of op `op` is known to be wrong."""
    return TrustedOutput(op.encode(), index)


def kernel_device(str device):
    """The device rdmadev's node for a half on `device` runs on: `device` if it is a CPU, else
    its task's CPU (the half crosses through host memory)."""
    return KernelDevice(device.encode()).decode()
