// Status and Result<T>: Loom's internal and public error type.
//
// Contract: every fallible Loom function returns a Status (or Result<T>) that
// carries a code and a human-readable message naming what went wrong and where
// ("InvalidArgument: allreduce: count*size overflows"). Nothing in Loom throws
// across a public boundary; the NCCL shim converts Status to ncclResult_t in
// exactly one place.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace loom {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,   // bad input from the caller (null buffer, bad dtype, ...)
  kInvalidUsage,      // API misuse (use after destroy, unmatched group_end, ...)
  kNotSupported,      // valid request this build / algorithm cannot serve
  kSystemError,       // OS call failed (errno in message)
  kRemoteError,       // a peer failed, died or aborted
  kTimeout,           // a deadline passed
  kAborted,           // the communicator was aborted locally
  kInternal,          // a Loom bug
  kInProgress,        // non-blocking operation not finished yet
  kCudaError,         // the CUDA runtime failed a call (message names it)
};

const char* status_code_name(StatusCode code);

// An ok Status is a code and a null pointer: every call on the per-op path
// returns one, and constructing, moving and destroying it costs a few
// instructions (a std::string member cost ~10 per Status, ~100 per 8 B op).
// Only a failure allocates its message.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message)
      : code_(code), message_(message.empty() ? nullptr : new std::string(std::move(message))) {}
  Status(const Status& o) : code_(o.code_), message_(o.message_ ? new std::string(*o.message_) : nullptr) {}
  Status(Status&& o) noexcept : code_(o.code_), message_(o.message_) {
    o.code_ = StatusCode::kOk;
    o.message_ = nullptr;
  }
  Status& operator=(const Status& o) {
    if (this != &o) *this = Status(o);
    return *this;
  }
  Status& operator=(Status&& o) noexcept {
    std::swap(code_, o.code_);
    std::swap(message_, o.message_);
    return *this;
  }
  ~Status() { delete message_; }

  static Status ok() { return Status(); }
  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_ ? *message_ : empty_message(); }
  // "Code: message", the form written to logs and to ncclGetLastError.
  std::string to_string() const;
  // Returns a copy whose message is prefixed with "context: ".
  Status with_context(const std::string& context) const;

 private:
  static const std::string& empty_message();
  StatusCode code_ = StatusCode::kOk;
  std::string* message_ = nullptr;  // owned; null when empty
};

inline Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status invalid_usage(std::string m) { return {StatusCode::kInvalidUsage, std::move(m)}; }
inline Status not_supported(std::string m) { return {StatusCode::kNotSupported, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status cuda_error(std::string m) { return {StatusCode::kCudaError, std::move(m)}; }
inline Status remote_error(std::string m) { return {StatusCode::kRemoteError, std::move(m)}; }
inline Status timeout_error(std::string m) { return {StatusCode::kTimeout, std::move(m)}; }
inline Status aborted_error(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
// Builds a kSystemError whose message ends with strerror(err).
Status system_error(const std::string& what, int err);

// Result<T>: a value or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}           // NOLINT(implicit)
  Result(Status status) : v_(std::move(status)) {}    // NOLINT(implicit)
  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace loom

// Early return of a non-ok Status from the enclosing function.
#define LOOM_RETURN_IF_ERROR(expr)          \
  do {                                      \
    ::loom::Status loom_st_ = (expr);       \
    if (!loom_st_.is_ok()) return loom_st_; \
  } while (0)

#define LOOM_CONCAT_INNER_(a, b) a##b
#define LOOM_CONCAT_(a, b) LOOM_CONCAT_INNER_(a, b)
// `LOOM_ASSIGN_OR_RETURN(auto x, f());` assigns the value or returns the Status.
#define LOOM_ASSIGN_OR_RETURN(lhs, expr) \
  LOOM_ASSIGN_OR_RETURN_IMPL_(LOOM_CONCAT_(loom_res_, __LINE__), lhs, expr)
#define LOOM_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.is_ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
