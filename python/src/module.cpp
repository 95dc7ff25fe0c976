// kestrel._kestrel: the extension module behind the Python package (python/kestrel). The
// public API, its docstrings and argument defaults live in python/kestrel/_model.py; this layer
// loads, validates, runs and streams, releasing the GIL while it computes.
#include <Python.h>

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "core.h"
#include "kestrel/formats/gguf.h"
#include "kestrel/runtime/grammar.h"
#include "kestrel/server/api_error.h"
#include "kestrel/text/reply_parser.h"
#include "stream.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace kestrel::python {
namespace {

// The kestrel.Error hierarchy (the Python package re-exports these).
struct Errors {
  PyObject* error = nullptr;            // kestrel.Error: anything Kestrel reports
  PyObject* model_file = nullptr;       // a missing, truncated or corrupt model file
  PyObject* invalid_request = nullptr;  // bad arguments (also a ValueError)
  PyObject* context_length = nullptr;   // the prompt does not fit the context
  PyObject* grammar = nullptr;          // a schema, grammar or regex that does not compile
  PyObject* option = nullptr;           // options that do not fit the model
};
Errors errors;

PyObject* new_error(nb::module_& m, const char* name, const char* doc, PyObject* bases) {
  const std::string qualified = std::string("kestrel.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  if (type == nullptr) throw nb::python_error();
  m.attr(name) = nb::handle(type);
  return type;
}

void raise(PyObject* type, const char* message, const std::string& param = "", const std::string& code = "") {
  PyObject* instance = PyObject_CallFunction(type, "s", message);
  if (instance == nullptr) return;  // the error of the call is set
  PyObject_SetAttrString(instance, "param", param.empty() ? Py_None : nb::str(param.c_str()).ptr());
  PyObject_SetAttrString(instance, "code", code.empty() ? Py_None : nb::str(code.c_str()).ptr());
  PyErr_SetObject(type, instance);
  Py_DECREF(instance);
}

void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const server::ApiError& e) {
    const bool context = e.body()["error"]["code"] == "context_length_exceeded";
    const std::string code = e.body()["error"]["code"].is_string() ? e.body()["error"]["code"].get<std::string>() : "";
    raise(context ? errors.context_length : errors.invalid_request, e.what(), e.body()["error"]["param"].is_string()
              ? e.body()["error"]["param"].get<std::string>() : "", code);
  } catch (const ContextLengthExceeded& e) {
    raise(errors.context_length, e.what(), "", "context_length_exceeded");
  } catch (const InvalidArgument& e) {
    raise(errors.invalid_request, e.what());
  } catch (const runtime::InvalidGrammar& e) {
    raise(errors.grammar, e.what());
  } catch (const runtime::OptionMismatch& e) {
    raise(errors.option, e.what());
  } catch (const gguf::GgufError& e) {
    raise(errors.model_file, e.what());
  } catch (const Error& e) {
    raise(errors.error, e.what());
  }
}

// Text to str: invalid UTF-8 (a byte token cut off) becomes U+FFFD instead of an exception.
nb::str utf8(const std::string& s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
  if (o == nullptr) throw nb::python_error();
  return nb::steal<nb::str>(o);
}

std::string dump(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

// A stream that this thread left open on the model (a loop over it left by an exception) ends
// before the thread takes the model again, instead of waiting for itself. GIL held.
void end_stream_left_open(Core& core, const TokenStream* self) {
  TokenStream* open = core.lock.stream_left_open_by_this_thread();
  if (open != nullptr && open != self) open->close();
}

using ReplyEventTuple = std::tuple<std::string, nb::str, std::string, std::string>;

std::vector<ReplyEventTuple> events(const std::vector<text::ReplyEvent>& in) {
  std::vector<ReplyEventTuple> out;
  for (const auto& e : in) {
    const char* kind = e.kind == text::ReplyEvent::Kind::kContent     ? "content"
                       : e.kind == text::ReplyEvent::Kind::kReasoning ? "reasoning"
                                                                      : "tool_call";
    out.emplace_back(kind, utf8(e.text), e.call.name, e.kind == text::ReplyEvent::Kind::kToolCall ? dump(e.call.arguments) : "");
  }
  return out;
}

struct ReplyParserBox {
  text::ReplyParser parser;
};

}  // namespace
}  // namespace kestrel::python

NB_MODULE(_kestrel, m) {
  using namespace kestrel;
  using namespace kestrel::python;
  m.doc() = "Kestrel's extension module; use the kestrel package (docs/python.md).";

  errors.error = new_error(m, "Error", "Base class of the errors Kestrel reports; str(e) is its message.", PyExc_Exception);
  errors.model_file = new_error(m, "ModelFileError", "A model file that is missing, truncated, corrupt or of an unknown architecture.",
                                errors.error);
  nb::object invalid_bases = nb::make_tuple(nb::handle(errors.error), nb::handle(PyExc_ValueError));
  errors.invalid_request = new_error(m, "InvalidRequestError",
                                     "An argument out of range or of the wrong form; `param` names the field when known.",
                                     invalid_bases.ptr());
  errors.context_length = new_error(m, "ContextLengthError", "The prompt and the tokens asked for do not fit the context (n_ctx).",
                                    errors.invalid_request);
  errors.grammar = new_error(m, "GrammarError", "A JSON schema, grammar or regular expression that does not compile.",
                             errors.invalid_request);
  errors.option = new_error(m, "OptionError", "A model option that does not fit the model (head='flash' without FlashHead, ...).",
                            errors.invalid_request);
  nb::register_exception_translator(translate);

  nb::class_<Core>(m, "Engine")
      .def_prop_ro("path", [](const Core& c) { return c.path; })
      .def_prop_ro("warning", [](const Core& c) { return c.warning; })
      .def_prop_ro("n_ctx", [](const Core& c) { return c.engine->n_ctx(); })
      .def_prop_ro("n_vocab", [](const Core& c) { return c.engine->tokenizer().n_vocab(); })
      .def_prop_ro("has_chat_template", [](const Core& c) { return c.engine->has_chat_template(); })
      .def_prop_ro("chat_format", [](const Core& c) {
        return std::string(c.chat_template == server::ChatTemplate::kGemma4 ? "gemma4" : "gemma3");
      })
      .def_prop_ro("flashhead", [](const Core& c) { return c.engine->flashhead() != nullptr; })
      .def_prop_ro("has_draft_model", [](const Core& c) { return c.engine->draft_model() != nullptr; })
      .def_prop_ro("stop_tokens", [](const Core& c) { return c.engine->stop_tokens(); })
      .def("encode_prompt",
           [](const Core& c, const std::string& text) { return c.engine->encode(text, false); }, "text"_a)
      .def("tokenize",
           [](const Core& c, const std::string& text, bool add_special, bool parse_special) {
             return c.engine->tokenizer().encode(text, add_special, parse_special);
           },
           "text"_a, "add_special"_a, "parse_special"_a)
      .def("detokenize",
           [](const Core& c, const std::vector<TokenId>& ids, bool render_special) {
             const size_t n = c.engine->tokenizer().n_vocab();
             for (TokenId t : ids) {
               if (t < 0 || static_cast<size_t>(t) >= n) {
                 throw InvalidArgument("token id " + std::to_string(t) + " is outside the vocabulary of " + std::to_string(n));
               }
             }
             return utf8(c.engine->tokenizer().decode(ids, render_special));
           },
           "ids"_a, "render_special"_a);

  m.def(
      "load",
      [](const std::string& model, std::optional<size_t> n_ctx, int threads, const std::string& precision,
         const std::string& head, size_t probes, const std::string& decode_act, std::optional<std::string> draft_model,
         const std::string& cache_type_k, const std::string& cache_type_v) {
        LoadArgs a{model, n_ctx, threads, precision, head, probes, decode_act, std::move(draft_model), cache_type_k,
                   cache_type_v};
        nb::gil_scoped_release release;
        return load(a);
      },
      "model"_a, "n_ctx"_a.none(), "threads"_a, "precision"_a, "head"_a, "probes"_a, "decode_act"_a,
      "draft_model"_a.none(), "cache_type_k"_a = "f16", "cache_type_v"_a = "f16");

  nb::class_<Sequence>(m, "Sequence")
      .def_static(
          "default_of", [](std::shared_ptr<Core> core) { return std::make_shared<Sequence>(Sequence{std::move(core), nullptr}); },
          "core"_a)
      .def_static(
          "new", [](std::shared_ptr<Core> core) {
            auto s = std::make_shared<Sequence>();
            s->core = core;
            nb::gil_scoped_release release;
            s->own = std::make_unique<runtime::Session>(*core->engine);
            return s;
          },
          "core"_a)
      .def_prop_ro("cached_tokens", [](Sequence& s) {
        auto t = s.session().cached_tokens();
        return std::vector<TokenId>(t.begin(), t.end());
      })
      .def("reset", [](Sequence& s) {
        end_stream_left_open(*s.core, nullptr);
        nb::gil_scoped_release release;
        s.core->lock.acquire(nullptr);
        s.session().reset();
        s.core->lock.release();
      });

  nb::class_<Request>(m, "Request")
      .def_prop_ro("prompt", [](const Request& r) { return r.prompt; })
      .def_prop_ro("forced_tools", [](const Request& r) { return r.chat_prompt.forced_tools; });

  m.def(
      "make_request",
      [](Core& core, std::vector<TokenId> prompt, size_t max_tokens, float temperature, int top_k, float top_p,
         float min_p, float repeat_penalty, int repeat_last_n, float presence_penalty, float frequency_penalty,
         std::optional<uint64_t> seed, std::vector<std::string> stop, bool ignore_eos, size_t min_tokens,
         int logprobs, std::vector<std::pair<int64_t, float>> logit_bias, std::string draft, size_t draft_max,
         std::string draft_accept, std::optional<std::string> json_schema, std::optional<std::string> grammar,
         std::optional<std::string> regex, bool cache_prompt) {
        GenerateArgs a;
        a.max_tokens = max_tokens;
        a.sampler.temperature = temperature;
        a.sampler.top_k = top_k;
        a.sampler.top_p = top_p;
        a.sampler.min_p = min_p;
        a.sampler.repeat_penalty = repeat_penalty;
        a.sampler.repeat_last_n = repeat_last_n;
        a.sampler.presence_penalty = presence_penalty;
        a.sampler.frequency_penalty = frequency_penalty;
        a.seed = seed;
        a.stop = std::move(stop);
        a.ignore_eos = ignore_eos;
        a.min_tokens = min_tokens;
        a.logprobs = logprobs;
        a.logit_bias = std::move(logit_bias);
        a.draft = std::move(draft);
        a.draft_max = draft_max;
        a.draft_accept = std::move(draft_accept);
        a.json_schema = std::move(json_schema);
        a.grammar = std::move(grammar);
        a.regex = std::move(regex);
        nb::gil_scoped_release release;  // compiling a grammar can take a while
        return make_request(core, std::move(prompt), a, cache_prompt);
      },
      "core"_a, "prompt"_a, "max_tokens"_a, "temperature"_a, "top_k"_a, "top_p"_a, "min_p"_a, "repeat_penalty"_a,
      "repeat_last_n"_a, "presence_penalty"_a, "frequency_penalty"_a, "seed"_a.none(), "stop"_a, "ignore_eos"_a,
      "min_tokens"_a, "logprobs"_a, "logit_bias"_a, "draft"_a, "draft_max"_a, "draft_accept"_a,
      "json_schema"_a.none(), "grammar"_a.none(), "regex"_a.none(), "cache_prompt"_a);

  m.def(
      "make_chat_request",
      [](Core& core, const std::string& body, const std::string& draft, size_t draft_max,
         const std::string& draft_accept, bool cache_prompt) {
        nb::gil_scoped_release release;
        return make_chat_request(core, body, draft, draft_max, draft_accept, cache_prompt);
      },
      "core"_a, "body"_a, "draft"_a, "draft_max"_a, "draft_accept"_a, "cache_prompt"_a);

  m.def(
      "run",
      [](Sequence& seq, const Request& request, bool check_signals) {
        end_stream_left_open(*seq.core, nullptr);
        bool interrupted = false;
        std::function<bool()> keep_going;
        if (check_signals) {
          // Ctrl-C: Python's handlers run between tokens; one that raises stops the generation.
          keep_going = [&interrupted] {
            nb::gil_scoped_acquire acquire;
            if (PyErr_CheckSignals() != 0) {
              interrupted = true;
              return false;
            }
            return true;
          };
        }
        runtime::GenerateResult result;
        {
          nb::gil_scoped_release release;
          result = run(seq, request, keep_going);
        }
        if (interrupted) throw nb::python_error();
        return dump(result_json(*seq.core, request, result));
      },
      "seq"_a, "request"_a, "check_signals"_a);

  nb::class_<TokenStream>(m, "TokenStream")
      .def(nb::init<std::shared_ptr<Sequence>, Request>(), "seq"_a, "request"_a)
      .def("__iter__", [](nb::handle self) { return self; })
      .def("__next__",
           [](TokenStream& s) {
             TokenStream::Executing executing(s);
             if (!s.finished()) end_stream_left_open(*s.sequence().core, &s);
             std::optional<std::string> piece;
             {
               nb::gil_scoped_release release;
               piece = s.next();
             }
             if (!piece) throw nb::stop_iteration();
             return utf8(*piece);
           })
      .def("close", &TokenStream::close)
      .def_prop_ro("finished", &TokenStream::finished)
      .def_prop_ro("result", [](const TokenStream& s) -> std::optional<std::string> {
        if (s.result().is_null()) return std::nullopt;
        return dump(s.result());
      });

  nb::class_<ReplyParserBox>(m, "ReplyParser")
      .def("__init__",
           [](ReplyParserBox* self, const Request& r) {
             new (self) ReplyParserBox{text::ReplyParser(r.chat_prompt.reply_format, r.chat_prompt.parse_tools)};
           },
           "request"_a)
      .def("feed", [](ReplyParserBox& p, const std::string& text) { return events(p.parser.feed(text)); }, "text"_a)
      .def("finish", [](ReplyParserBox& p) { return events(p.parser.finish()); });

  m.def(
      "parse_reply",
      [](const Request& r, const std::string& text) {
        return events(text::parse_reply(r.chat_prompt.reply_format, r.chat_prompt.parse_tools, text));
      },
      "request"_a, "text"_a);
}
