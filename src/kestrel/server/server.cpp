#include "kestrel/server/server.h"

#include <pthread.h>
#include <sys/socket.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <thread>

#include "kestrel/base/error.h"
#include "kestrel/server/app.h"

namespace kestrel::server {

size_t http_thread_count(const ServerOptions& options) {
  return options.http_threads != 0 ? options.http_threads : options.max_queue + options.parallel + 4;
}

int serve(const ServerOptions& options, const EngineLoader& load) {
  if (http_thread_count(options) < options.max_queue + kMinSpareHttpThreads) {
    throw Error("--http-threads " + std::to_string(http_thread_count(options)) + " must exceed --queue " +
                std::to_string(options.max_queue) + " by at least " + std::to_string(kMinSpareHttpThreads) +
                ": every admitted request holds a connection thread, and /health and /metrics need one too");
  }
  // SIGINT/SIGTERM are taken by one thread (sigwait) that stops the server; every other thread
  // inherits the blocked mask. A closed client socket must not kill the process (SIGPIPE).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  App app(options);
  app.install_routes();
  httplib::Server& http = app.http();
  // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, with which a second server on
  // a busy port binds too and the kernel splits the connections between the two.
  http.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  int port = options.port;
  if (port == 0) {
    port = http.bind_to_any_port(options.host);
    if (port < 0) throw Error("cannot bind " + options.host + " to a free port");
  } else if (!http.bind_to_port(options.host, port)) {
    throw Error("cannot listen on " + options.host + ":" + std::to_string(port) + " (in use, or not an address here)");
  }
  std::atomic<bool> listener_done{false};
  std::thread listener([&] {
    http.listen_after_bind();
    listener_done = true;
  });
  std::thread signal_waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    app.stop_generating();
    // httplib's stop() does nothing until listen has started; a model that fails to load at once
    // can get here first, so stop until the listener has returned.
    while (!listener_done) {
      http.stop();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  std::fprintf(stderr, "kestrel serve: listening on http://%s:%d\n", options.host.c_str(), port);
  std::exception_ptr failure;
  try {
    app.set_engine(load());
    std::fprintf(stderr, "kestrel serve: ready; model '%s', %s\n", options.model_id.c_str(),
                 app.chat_format_note().c_str());
  } catch (...) {
    failure = std::current_exception();
    kill(getpid(), SIGTERM);  // wakes the signal thread, which stops the server
  }
  signal_waiter.join();
  listener.join();
  if (failure) std::rethrow_exception(failure);
  std::fprintf(stderr, "kestrel serve: stopped\n");
  return 0;
}


}  // namespace kestrel::server
