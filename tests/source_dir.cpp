#include "source_dir.h"

namespace kestrel::testing {

const std::filesystem::path& source_dir() {
  static const std::filesystem::path dir(KESTREL_SOURCE_DIR);
  return dir;
}

}  // namespace kestrel::testing
