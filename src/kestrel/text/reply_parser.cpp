#include "kestrel/text/reply_parser.h"

#include <algorithm>

namespace kestrel::text {
namespace {

// Length of the longest suffix of `text` that is a proper prefix of `marker`.
size_t partial_suffix(std::string_view text, std::string_view marker) {
  for (size_t len = std::min(marker.size() - 1, text.size()); len > 0; --len) {
    if (text.substr(text.size() - len) == marker.substr(0, len)) return len;
  }
  return 0;
}

// The first `marker` in `text` that is not inside a JSON string ("..." with backslash escapes):
// a Gemma 3 call's arguments may hold the closing tag as text (a free-form string argument),
// and the call ends only at the tag after its JSON body.
size_t find_outside_json_strings(std::string_view text, std::string_view marker) {
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (text.substr(i, marker.size()) == marker) {
      return i;
    }
  }
  return std::string_view::npos;
}

}  // namespace

ReplyParser::ReplyParser(ReplyFormat format, bool parse_tools) : format_(format), parse_tools_(parse_tools) {
  if (format == ReplyFormat::kGemma4) {
    tool_open_ = "<|tool_call>";
    tool_close_ = "<tool_call|>";
    think_open_ = "<|channel>";
    think_close_ = "<channel|>";
  } else {
    tool_open_ = "<tool_call>";
    tool_close_ = "</tool_call>";
  }
}

void ReplyParser::emit(std::vector<ReplyEvent>& out, ReplyEvent::Kind kind, std::string text) {
  if (text.empty()) return;
  if (!out.empty() && out.back().kind == kind && kind != ReplyEvent::Kind::kToolCall) {
    out.back().text += text;
    return;
  }
  ReplyEvent e;
  e.kind = kind;
  e.text = std::move(text);
  out.push_back(std::move(e));
}

bool ReplyParser::parse_call(std::string_view body, ToolCall& call) const {
  using nlohmann::json;
  if (format_ == ReplyFormat::kGemma4) {
    const size_t b = body.find_first_not_of(" \t\n");
    if (b == std::string_view::npos || body.substr(b, 5) != "call:") return false;
    body = body.substr(b + 5);
    const size_t brace = body.find('{');
    if (brace == std::string_view::npos || brace == 0) return false;
    std::string name(body.substr(0, brace));
    if (name.find_first_of(" \t\n<>{}") != std::string::npos) return false;
    const size_t end = body.find_last_not_of(" \t\n");
    json args = parse_gemma4_value(body.substr(brace, end - brace + 1));
    if (args.is_discarded() || !args.is_object()) return false;
    call.name = std::move(name);
    call.arguments = std::move(args);
    return true;
  }
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return false;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get<std::string>().empty()) return false;
  json args = j.value("arguments", json::object());
  if (args.is_string()) args = json::parse(args.get<std::string>(), nullptr, false);
  if (args.is_null()) args = json::object();
  if (args.is_discarded() || !args.is_object()) return false;
  call.name = name->get<std::string>();
  call.arguments = std::move(args);
  return true;
}

void ReplyParser::drain(std::vector<ReplyEvent>& out, bool final) {
  for (;;) {
    if (state_ == State::kText) {
      size_t at = std::string::npos;
      State next = State::kText;
      size_t marker_len = 0;
      if (parse_tools_) {
        at = buffer_.find(tool_open_);
        if (at != std::string::npos) next = State::kTool, marker_len = tool_open_.size();
      }
      if (!think_open_.empty()) {
        const size_t t = buffer_.find(think_open_);
        if (t != std::string::npos && t < at) at = t, next = State::kThink, marker_len = think_open_.size();
      }
      if (at == std::string::npos) {
        size_t hold = 0;
        if (!final) {
          if (parse_tools_) hold = partial_suffix(buffer_, tool_open_);
          if (!think_open_.empty()) hold = std::max(hold, partial_suffix(buffer_, think_open_));
        }
        emit(out, ReplyEvent::Kind::kContent, buffer_.substr(0, buffer_.size() - hold));
        buffer_.erase(0, buffer_.size() - hold);
        return;
      }
      emit(out, ReplyEvent::Kind::kContent, buffer_.substr(0, at));
      buffer_.erase(0, at + marker_len);
      state_ = next;
      think_started_ = false;
      continue;
    }
    if (state_ == State::kThink) {
      if (!think_started_) {
        const std::string_view label = "thought\n";
        if (buffer_.size() < label.size() && !final && std::string_view(label).substr(0, buffer_.size()) == buffer_) return;
        if (buffer_.compare(0, label.size(), label) == 0) buffer_.erase(0, label.size());
        think_started_ = true;
      }
      const size_t at = buffer_.find(think_close_);
      if (at == std::string::npos) {
        const size_t hold = final ? 0 : partial_suffix(buffer_, think_close_);
        emit(out, ReplyEvent::Kind::kReasoning, buffer_.substr(0, buffer_.size() - hold));
        buffer_.erase(0, buffer_.size() - hold);
        return;
      }
      emit(out, ReplyEvent::Kind::kReasoning, buffer_.substr(0, at));
      buffer_.erase(0, at + think_close_.size());
      state_ = State::kText;
      continue;
    }
    // kTool: the whole call is needed before anything can be said about it. (Gemma 4's strings
    // cannot hold its closing tag, a control token; Gemma 3's JSON strings can.)
    const size_t at = format_ == ReplyFormat::kGemma3 ? find_outside_json_strings(buffer_, tool_close_)
                                                      : buffer_.find(tool_close_);
    if (at == std::string::npos && !final) return;
    const std::string body = buffer_.substr(0, at);
    ToolCall call;
    if (parse_call(body, call)) {
      ReplyEvent e;
      e.kind = ReplyEvent::Kind::kToolCall;
      e.call = std::move(call);
      out.push_back(std::move(e));
    } else {
      emit(out, ReplyEvent::Kind::kContent, tool_open_ + body + (at == std::string::npos ? "" : tool_close_));
    }
    buffer_.erase(0, at == std::string::npos ? buffer_.size() : at + tool_close_.size());
    state_ = State::kText;
    if (final && buffer_.empty()) return;
  }
}

std::vector<ReplyEvent> ReplyParser::feed(std::string_view text) {
  buffer_ += text;
  std::vector<ReplyEvent> out;
  drain(out, false);
  return out;
}

std::vector<ReplyEvent> ReplyParser::finish() {
  std::vector<ReplyEvent> out;
  drain(out, true);
  return out;
}

std::vector<ReplyEvent> parse_reply(ReplyFormat format, bool parse_tools, std::string_view text) {
  ReplyParser parser(format, parse_tools);
  std::vector<ReplyEvent> events = parser.feed(text);
  std::vector<ReplyEvent> tail = parser.finish();
  std::vector<ReplyEvent> merged;
  for (auto* list : {&events, &tail}) {
    for (auto& e : *list) {
      if (!merged.empty() && merged.back().kind == e.kind && e.kind != ReplyEvent::Kind::kToolCall) {
        merged.back().text += e.text;
      } else {
        merged.push_back(std::move(e));
      }
    }
  }
  return merged;
}

}  // namespace kestrel::text
