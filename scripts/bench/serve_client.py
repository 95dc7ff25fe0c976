"""`kestrel serve` on a free loopback port for the benchmark scripts, with an openai client."""
import contextlib
import socket
import subprocess
import time

import openai


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def served(kestrel, model, threads, *extra):
    """Starts `kestrel serve -m MODEL -t THREADS --model-name m EXTRA...`, waits until it answers
    (at most 300 s), yields an openai client for model id "m", and stops the server."""
    port = free_port()
    server = subprocess.Popen([kestrel, "serve", "-m", model, "--port", str(port), "-t", str(threads),
                               "--model-name", "m", *map(str, extra)], stderr=subprocess.DEVNULL)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)
        deadline = time.time() + 300
        while True:
            try:
                client.models.list()
                break
            except openai.APIError:
                assert server.poll() is None and time.time() < deadline, "server did not start"
                time.sleep(0.2)
        yield client
    finally:
        server.terminate()
        server.wait(timeout=30)
