// Which functions the partition passes rewrite (the opt-in), decided by FindOptInPass before
// placement, while calls are not inlined yet: with RDMADEV_AUTO every function, else those
// that are, or call, a function rdmadev.optimize marked. opt_in.cc.
#pragma once

#include <string>
#include <vector>

namespace rdmadev_tf {

// What the partition passes rewrite: nothing; every function (RDMADEV_AUTO); a function that
// is, or calls, one marked by rdmadev.optimize. Python sets one by its name, "off", "all" or
// "marked" (rdmadev_set_pass_mode, opt_in.cc; rdmadev/tf/pass_mode.py): the numbers are this
// library's own.
constexpr int kRewriteNone = 0, kRewriteAll = 1, kRewriteMarked = 2;
int PassMode();

// Whether FindOptInPass found an instantiation of `function` opted in (leaves the record).
bool OptedIn(const std::string& function);

// The marked functions FindOptInPass recorded for an instantiation of `function` (none: not
// opted in); consumes the record.
std::vector<std::string> TakeOptIn(const std::string& function);

}  // namespace rdmadev_tf
