// Errors as values (DESIGN.md §2): a Status or an Expected<T> travels up to the CLI or HTTP edge, where it
// becomes one line on stderr or one JSON error body. Messages say what is wrong and where (file, tensor,
// field).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace deltaflow::core {

struct Error {
  std::string message;
};

// A Status is either ok or an Error. `[[nodiscard]]` so an ignored failure is a compile error under -Werror.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error e) : error_(std::move(e)) {}  // NOLINT: implicit by design, `return Error{...}`
  static Status ok() { return Status(); }
  bool is_ok() const { return !error_.has_value(); }
  explicit operator bool() const { return is_ok(); }
  const std::string& message() const { return error_->message; }
  const Error& error() const { return *error_; }

 private:
  std::optional<Error> error_;
};

// Expected<T>: a value or an Error. Access to value() on an error is a programming bug (asserted).
template <class T>
class [[nodiscard]] Expected {
 public:
  Expected(T v) : v_(std::move(v)) {}      // NOLINT
  Expected(Error e) : v_(std::move(e)) {}  // NOLINT
  Expected(Status s) : v_(s.error()) {}    // NOLINT: only for failed statuses
  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const Error& error() const { return std::get<Error>(v_); }
  const std::string& message() const { return error().message; }
  Status status() const { return is_ok() ? Status() : Status(error()); }

 private:
  std::variant<T, Error> v_;
};

}  // namespace deltaflow::core

#define DF_CONCAT_INNER(a, b) a##b
#define DF_CONCAT(a, b) DF_CONCAT_INNER(a, b)

// DF_TRY(status_expr): return the error from the enclosing function if the Status failed.
#define DF_TRY(expr)                                            \
  do {                                                          \
    auto df_try_status_ = (expr);                               \
    if (!df_try_status_.is_ok()) return df_try_status_.error(); \
  } while (0)

// DF_ASSIGN(lhs, expected_expr): unwrap an Expected into lhs, or return its error.
#define DF_ASSIGN(lhs, expr) DF_ASSIGN_IMPL(DF_CONCAT(df_assign_tmp_, __LINE__), lhs, expr)
#define DF_ASSIGN_IMPL(tmp, lhs, expr)  \
  auto tmp = (expr);                    \
  if (!tmp.is_ok()) return tmp.error(); \
  lhs = std::move(tmp).value()
