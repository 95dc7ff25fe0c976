// kestrel: the command-line front end.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <iterator>
#include <memory>
#include <new>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "commands.h"
#include "common.h"
#include "kestrel/base/error.h"
#include "kestrel/runtime/engine.h"

namespace {

// Help lines at most this wide (CLI11 2.1 prints each description on one line, however long).
constexpr size_t kHelpColumns = 100;

// `text` with its lines broken at spaces to at most `width` columns (a longer word keeps its own
// line). A line does not start with an option name ("-..."): it would read as that option's entry.
std::string wrap(std::string_view text, size_t width) {
  std::string out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::vector<std::string_view> words;
    for (size_t i = start; i < end;) {
      const size_t space = std::min(text.find(' ', i), end);
      if (space > i) words.push_back(text.substr(i, space - i));
      i = space + 1;
    }
    std::vector<std::string> lines(1);
    for (size_t w = 0; w < words.size(); ++w) {
      std::string& line = lines.back();
      if (line.empty() || line.size() + 1 + words[w].size() <= width) {
        if (!line.empty()) line += ' ';
        line += words[w];
        continue;
      }
      std::string next(words[w]);
      const size_t last_space = line.rfind(' ');
      if (next.front() == '-' && last_space != std::string::npos) {
        next = line.substr(last_space + 1) + " " + next;
        line.resize(last_space);
      }
      lines.push_back(std::move(next));
    }
    for (const auto& line : lines) out += line + "\n";
    if (end == text.size()) break;
    start = end + 1;
  }
  out.pop_back();  // the last line's "\n"
  return out;
}

// CLI11's layout with the descriptions wrapped to kHelpColumns, and one blank line between
// option groups (CLI11 2.1 puts two).
class HelpFormatter : public CLI::Formatter {
 public:
  std::string make_help(const CLI::App* app, std::string name, CLI::AppFormatMode mode) const override {
    std::string help = CLI::Formatter::make_help(app, std::move(name), mode);
    for (size_t at; (at = help.find("\n\n\n")) != std::string::npos;) help.erase(at, 1);
    return help;
  }
  std::string make_description(const CLI::App* app) const override {
    const std::string d = CLI::Formatter::make_description(app);
    return d.empty() ? d : wrap(d, kHelpColumns);
  }
  std::string make_option_desc(const CLI::Option* opt) const override {
    return wrap(opt->get_description(), kHelpColumns - column_width_);
  }
  std::string make_subcommand(const CLI::App* sub) const override {
    std::stringstream out;
    CLI::detail::format_help(out, sub->get_display_name(true), wrap(sub->get_description(), kHelpColumns - column_width_),
                             column_width_);
    return out.str();
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Kestrel: fast small language models on edge hardware"};
  app.formatter(std::make_shared<HelpFormatter>());  // before the subcommands, which take it over
  app.require_subcommand(1);
  app.set_version_flag("--version", KESTREL_VERSION);
  namespace t = kestrel::tools;
  const std::pair<const char*, t::Command> commands[] = {
      {"run", t::add_run_command(app)},
      {"chat", t::add_chat_command(app)},
      {"perplexity", t::add_perplexity_command(app)},
      {"build", t::add_build_command(app)},
      {"inspect", t::add_inspect_command(app)},
      {"flashhead-eval", t::add_flashhead_eval_command(app)},
      {"serve", t::add_serve_command(app)},
      {"export-tokenizer", t::add_export_tokenizer_command(app)},
      {"export", t::add_export_command(app)},
      {"bench", t::add_bench_command(app)},
  };
  // A first argument that names no command: say so (CLI11 would only say "A subcommand is required").
  if (argc > 1 && argv[1][0] != '-' &&
      std::none_of(std::begin(commands), std::end(commands), [&](const auto& c) { return c.first == std::string_view(argv[1]); })) {
    std::string names;
    for (const auto& [name, command] : commands) {
      if (!names.empty()) names += ", ";
      names += name;
    }
    std::fprintf(stderr, "kestrel: error: unknown command '%s' (commands: %s)\nRun with --help for more information.\n",
                 argv[1], names.c_str());
    return 2;  // usage error
  }
  // llama.cpp's short forms of --cache-type-k / -v: CLI11 takes a single dash before one letter
  // only (it would read -ctk as -c tk).
  std::vector<std::string> args(argv, argv + argc);
  for (auto& a : args) {
    if (a == "-ctk") a = "--cache-type-k";
    if (a == "-ctv") a = "--cache-type-v";
  }
  std::vector<char*> arg_ptrs;
  for (auto& a : args) arg_ptrs.push_back(a.data());
  try {
    app.parse(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "kestrel: error: %s\nRun with --help for more information.\n", e.what());
    return 2;  // usage error
  }
  try {
    for (const auto& [name, command] : commands) {
      if (app.got_subcommand(name)) return command();
    }
  } catch (const kestrel::tools::UsageError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "kestrel: error: %s\n", e.what());
    return 2;
  } catch (const kestrel::runtime::OptionMismatch& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "kestrel: error: %s\n", e.what());
    return 2;  // a usage error: an option (--probes, --ctx, --draft's model ...) does not fit the model
  } catch (const std::bad_alloc&) {
    // (what() would only say "std::bad_alloc")
    std::fflush(stdout);
    std::fprintf(stderr, "kestrel: error: out of memory: an allocation failed (lower --ctx or --parallel, or use a "
                         "smaller model or precision)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "kestrel: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
