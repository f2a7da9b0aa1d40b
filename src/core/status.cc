#include "loom/status.h"

#include <cstring>

namespace loom {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "Ok";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kInvalidUsage: return "InvalidUsage";
    case StatusCode::kNotSupported: return "NotSupported";
    case StatusCode::kSystemError: return "SystemError";
    case StatusCode::kRemoteError: return "RemoteError";
    case StatusCode::kTimeout: return "Timeout";
    case StatusCode::kAborted: return "Aborted";
    case StatusCode::kInternal: return "Internal";
    case StatusCode::kInProgress: return "InProgress";
    case StatusCode::kCudaError: return "CudaError";
  }
  return "Unknown";
}

const std::string& Status::empty_message() {
  static const std::string kEmpty;
  return kEmpty;
}

std::string Status::to_string() const {
  if (is_ok()) return "Ok";
  return std::string(status_code_name(code_)) + ": " + message();
}

Status Status::with_context(const std::string& context) const {
  if (is_ok()) return *this;
  return Status(code_, context + ": " + message());
}

Status system_error(const std::string& what, int err) {
  char buf[256];
  // GNU strerror_r returns the message pointer (may not use buf).
  const char* msg = strerror_r(err, buf, sizeof(buf));
  return Status(StatusCode::kSystemError, what + ": " + msg + " (errno " + std::to_string(err) + ")");
}

}  // namespace loom
