#include "kestrel/server/embeddings.h"

#include <bit>
#include <cstdint>
#include <cstring>

#include "kestrel/server/api_error.h"

namespace kestrel::server {
namespace {

using nlohmann::json;

const json* field(const json& body, const char* key) {
  auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

}  // namespace

EmbeddingsRequest parse_embeddings_request(const json& body) {
  if (!body.is_object()) throw bad_request("the request body must be a JSON object");
  EmbeddingsRequest r;
  if (const json* model = field(body, "model")) {
    if (!model->is_string()) throw bad_request("'model' must be a string", "model");
    r.model = model->get<std::string>();
  }
  const json* input = field(body, "input");
  if (!input) throw bad_request("'input' is required", "input");
  r.inputs = parse_prompt_list(*input, "input", kMaxEmbeddingInputs);
  if (const json* format = field(body, "encoding_format")) {
    if (!format->is_string() || (*format != "float" && *format != "base64")) {
      throw bad_request("'encoding_format' must be float or base64", "encoding_format");
    }
    r.base64 = *format == "base64";
  }
  if (const json* dims = field(body, "dimensions")) {
    if (!dims->is_number_integer() || dims->get<int64_t>() < 1) {
      throw bad_request("'dimensions' must be a positive integer", "dimensions");
    }
    r.dimensions = dims->get<int64_t>();
  }
  if (const json* user = field(body, "user"); user && !user->is_string()) {
    throw bad_request("'user' must be a string", "user");
  }
  return r;
}

std::string base64_floats(std::span<const float> floats) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::vector<uint8_t> bytes(floats.size() * 4);
  for (size_t i = 0; i < floats.size(); ++i) {
    uint32_t bits = std::bit_cast<uint32_t>(floats[i]);
    for (size_t b = 0; b < 4; ++b) bytes[i * 4 + b] = static_cast<uint8_t>(bits >> (8 * b));  // little-endian
  }
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t v = static_cast<uint32_t>(bytes[i]) << 16;
    if (n > 1) v |= static_cast<uint32_t>(bytes[i + 1]) << 8;
    if (n > 2) v |= bytes[i + 2];
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += n > 1 ? kAlphabet[(v >> 6) & 63] : '=';
    out += n > 2 ? kAlphabet[v & 63] : '=';
  }
  return out;
}

json embeddings_response(const std::vector<std::vector<float>>& vectors, bool base64, const std::string& model,
                         size_t prompt_tokens) {
  json data = json::array();
  for (size_t i = 0; i < vectors.size(); ++i) {
    data.push_back({{"object", "embedding"},
                    {"index", i},
                    {"embedding", base64 ? json(base64_floats(vectors[i])) : json(vectors[i])}});
  }
  return {{"object", "list"},
          {"data", std::move(data)},
          {"model", model},
          {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}};
}

}  // namespace kestrel::server
