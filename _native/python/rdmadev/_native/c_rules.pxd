# Raw declarations of _native/tf/pass/rules.h: the rules the planner applies as the passes do.
from libcpp cimport bool
from libcpp.string cimport string


cdef extern from "rules.h" namespace "rdmadev_tf":
    const char* const* kSendOps
    const char* const* kRecvOps
    const char* kBranchMark
    const char* kBoundAttr
    bool CrossesTasks(const string& send_device, const string& recv_device)
    bool TrustedOutput(const string& op, int index)
    string KernelDevice(const string& device)
