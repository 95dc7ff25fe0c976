// Gemma 3 as a GemmaConfig: the per-layer data the gemma3 reader derives from the default
// model's metadata (Gemma 3 270M; skipped when it is not installed). Gemma 4's configuration is
// checked in test_gemma4.cpp.
#include <gtest/gtest.h>

#include <filesystem>

#include "kestrel/formats/gguf.h"
#include "kestrel/model/gemma_config.h"
#include "kestrel/runtime/model_path.h"
#include "test_models.h"

namespace kestrel::model {
namespace {

TEST(Gemma3Config, FiveSlidingLayersPerGlobalOneAndNoGemma4Parts) {
  KESTREL_DEFAULT_MODEL_OR_SKIP(path)
  const gguf::File file = gguf::File::open(path);
  const GemmaConfig c = GemmaConfig::from_gguf(file);
  EXPECT_EQ(c.architecture, "gemma3");
  ASSERT_EQ(c.n_layers(), 18u);
  EXPECT_EQ(c.d_model, 640u);
  EXPECT_EQ(c.n_heads, 4u);
  EXPECT_EQ(c.ple_dim, 0u);
  EXPECT_FALSE(c.v_norm);
  EXPECT_FALSE(c.v_optional);
  for (size_t il = 0; il < c.n_layers(); ++il) {
    const GemmaLayerConfig& l = c.layers[il];
    const bool global = il % 6 == 5;
    EXPECT_EQ(l.sliding, !global) << il;
    EXPECT_EQ(l.window, global ? 0u : 512u) << il;
    EXPECT_EQ(l.head_dim, 256u);
    EXPECT_EQ(l.n_kv_heads, 1u);
    EXPECT_EQ(l.d_ff, 2048u);
    EXPECT_TRUE(c.owns_kv(il));
    EXPECT_EQ(l.rope.n_rot, 256u);
    EXPECT_DOUBLE_EQ(l.rope.base, global ? 1e6 : 1e4) << il;
    EXPECT_FLOAT_EQ(l.rope.position_scale, 1.0f);
    EXPECT_FALSE(l.rope.freq_factors);
    EXPECT_FLOAT_EQ(l.query_scale, 1.0f / 16.0f);
  }
}

}  // namespace
}  // namespace kestrel::model
