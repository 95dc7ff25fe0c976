// Error type shared by every layer of Kestrel.
#pragma once

#include <stdexcept>
#include <string>

namespace kestrel {

/// Base class of every error Kestrel throws on bad input (files, prompts, options).
/// Callers that must never abort (the CLI, the server) catch this and report `what()`.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace kestrel
