// rdmadev errors as TensorFlow statuses, with the fix-it hint in the message.
#pragma once

#include "common.h"
#include "completion.h"
#include "tensorflow/core/platform/errors.h"

namespace rdmadev_tf {

inline absl::Status ToStatus(rdmadev::ErrorKind kind, const std::string& message) {
  switch (kind) {
    case rdmadev::ErrorKind::kTimeout: return absl::DeadlineExceededError(message);
    case rdmadev::ErrorKind::kPeerLost: return absl::UnavailableError(message);
    case rdmadev::ErrorKind::kConfig:
    case rdmadev::ErrorKind::kBounds: return absl::InvalidArgumentError(message);
    case rdmadev::ErrorKind::kAuth: return absl::PermissionDeniedError(message);
    case rdmadev::ErrorKind::kClosed: return absl::CancelledError(message);
    default: return absl::InternalError(message);
  }
}

inline absl::Status ToStatus(const rdmadev::Error& e) {
  return ToStatus(e.kind(), std::string(e.what()) + (e.hint().empty() ? "" : ". Fix: " + e.hint()));
}

inline absl::Status ToStatus(const rdmadev::Status& s) { return ToStatus(s.kind, s.message); }

}  // namespace rdmadev_tf
