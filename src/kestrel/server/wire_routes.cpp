// The routes of OpenAI's Responses API and Anthropic's Messages API (both run as chat requests:
// responses_request.h, messages_request.h).
#include "kestrel/server/app.h"

namespace kestrel::server {

void App::install_wire_routes() {
  post("/v1/responses", [this](const httplib::Request& req, httplib::Response& res, const std::string& body) {
    handle_generate(req, res, body, Endpoint::kChat, Wire::kResponses);
  });
  // A stored response (store: true, the default), as OpenAI's GET /v1/responses/{id}.
  http_.Get(R"(/v1/responses/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
    guarded("responses", res, [&] {
      check_auth(req);
      auto entry = responses_.get(req.matches[1].str());
      if (!entry) {
        throw ApiError(404, "Response with id '" + req.matches[1].str() + "' not found (not stored, or evicted)", "",
                       "not_found");
      }
      send_json(res, 200, entry->response);
    });
  });
  post("/v1/messages", [this](const httplib::Request& req, httplib::Response& res, const std::string& body) {
    handle_generate(req, res, body, Endpoint::kChat, Wire::kMessages);
  });
  post("/v1/messages/count_tokens", [this](const httplib::Request& req, httplib::Response& res, const std::string& raw) {
    guarded("messages", res, [&] {
      check_auth(req);
      check_ready();
      const MessagesRequest m = messages_to_chat(parse_ordered_body(raw), true);
      const GenerationRequest r = parse_chat_request(json::parse(m.chat.dump()));
      const ChatPrompt prompt = build_chat_prompt(chat_template_, r);
      send_json(res, 200, {{"input_tokens", engine_->tokenizer().encode(prompt.text, false, true).size()}});
    }, Wire::kMessages);
  });
}

}  // namespace kestrel::server
