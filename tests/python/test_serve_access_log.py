"""The access log (one line per request on stderr, text or JSON, off with --quiet) and /metrics'
count of every HTTP status (issue 47: a client knocking on a missing door was invisible)."""
import json
import re
import time

import pytest

from serve_helpers import KESTREL, Server, model_path

pytestmark = pytest.mark.skipif(not model_path().exists() or not KESTREL.exists(),
                                reason="default model or build/kestrel missing")

TEXT_LINE = re.compile(r'^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z 127\.0\.0\.1 "(\S+) (\S+)" (\d{3})'
                       r'(?: prompt=(\d+) cached=(\d+) completion=(\d+))? ms=(\d+\.\d)$')


def knock(server):
    """A generation, a 404, a 400 and a 405; returns the generation's usage."""
    status, r = server.request("POST", "/v1/completions", {"prompt": "The sky is", "max_tokens": 5, "temperature": 0})
    assert status == 200, r
    assert server.request("POST", "/v1/responses-not-here", {})[0] == 404
    assert server.request("POST", "/v1/completions", {"prompt": 5})[0] == 400
    assert server.request("GET", "/v1/completions")[0] == 405
    return r["usage"]


def log_lines(server, keep):
    # the logger runs once the response is written: give it a moment
    time.sleep(0.2)
    return [line for line in server.stderr_text().splitlines() if keep(line)]


def test_text_lines_and_every_status_counted():
    s = Server()
    try:
        before_404 = 0.0
        usage = knock(s)
        lines = log_lines(s, TEXT_LINE.match)
        parsed = [TEXT_LINE.match(line).groups() for line in lines]
        gen = [p for p in parsed if p[:3] == ("POST", "/v1/completions", "200")]
        assert len(gen) == 1, lines
        assert int(gen[0][3]) == usage["prompt_tokens"] and int(gen[0][5]) == usage["completion_tokens"], (gen, usage)
        assert int(gen[0][4]) == usage["prompt_tokens_details"]["cached_tokens"]
        assert float(gen[0][6]) > 0
        assert ("POST", "/v1/responses-not-here", "404") in [p[:3] for p in parsed], lines
        assert ("POST", "/v1/completions", "400") in [p[:3] for p in parsed], lines
        assert ("GET", "/v1/completions", "405") in [p[:3] for p in parsed], lines
        # a line without tokens for requests that generated nothing
        assert all(p[3] is None for p in parsed if p[2] != "200" or p[1] == "/health"), lines
        assert s.metric('kestrel_http_responses_total{status="404"}') >= 1 + before_404
        assert s.metric('kestrel_http_responses_total{status="400"}') >= 1
        assert s.metric('kestrel_http_responses_total{status="405"}') >= 1
        n404 = s.metric('kestrel_http_responses_total{status="404"}')
        s.request("GET", "/nothing/here")
        time.sleep(0.1)
        assert s.metric('kestrel_http_responses_total{status="404"}') == n404 + 1
    finally:
        s.stop()


def test_json_lines_and_a_line_path_cannot_forge():
    s = Server("--log-format", "json")
    try:
        usage = knock(s)
        s.request("GET", '/a"b%0a')
        records = [json.loads(line) for line in log_lines(s, lambda line: line.startswith("{"))]
        gen = [r for r in records if r["path"] == "/v1/completions" and r["status"] == 200]
        assert len(gen) == 1, records
        assert gen[0]["method"] == "POST" and gen[0]["remote"] == "127.0.0.1"
        assert gen[0]["prompt_tokens"] == usage["prompt_tokens"]
        assert gen[0]["completion_tokens"] == usage["completion_tokens"]
        assert gen[0]["cached_tokens"] == usage["prompt_tokens_details"]["cached_tokens"]
        assert gen[0]["ms"] > 0 and re.match(r"\d{4}-\d\d-\d\dT", gen[0]["time"])
        assert any(r["status"] == 404 and "prompt_tokens" not in r for r in records), records
    finally:
        s.stop()


def test_quiet_logs_no_requests():
    s = Server("--quiet")
    try:
        knock(s)
        assert log_lines(s, TEXT_LINE.match) == []
        assert s.metric('kestrel_http_responses_total{status="404"}') == 1
    finally:
        s.stop()


def test_bad_log_format_is_refused():
    import subprocess
    r = subprocess.run([str(KESTREL), "serve", "--log-format", "xml"], capture_output=True, text=True)
    assert r.returncode != 0 and "--log-format" in r.stderr, r.stderr
