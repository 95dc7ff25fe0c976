// A test fixture holding one Engine on the default model for a whole suite (skipped, with the
// reason, when the model is not installed).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "kestrel/runtime/engine.h"
#include "kestrel/runtime/model_path.h"

namespace kestrel::runtime {

template <size_t kContext, quant::Precision kPrecision = quant::Precision::kSource>
class WithDefaultEngine : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    try {
      EngineOptions options;
      options.n_ctx = kContext;
      options.load.precision = kPrecision;
      engine_ = std::make_unique<Engine>(default_model_path(), options);
    } catch (const std::exception& e) {
      skip_reason_ = e.what();
    }
  }
  static void TearDownTestSuite() { engine_.reset(); }
  void SetUp() override {
    if (!engine_) GTEST_SKIP() << skip_reason_;
  }
  static inline std::unique_ptr<Engine> engine_;
  static inline std::string skip_reason_;
};

}  // namespace kestrel::runtime
