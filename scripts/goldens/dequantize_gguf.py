#!/usr/bin/env python3
"""Re-encodes a GGUF with every tensor dequantized to float32 by gguf-py (an exact conversion).

llama.cpp runs an F32 file without quantizing activations (its vec_dot type for F32 weights is
F32), so on this file it computes the same model as the quantized original in float32 math:
the reference Kestrel's float32 forward pass is held to.

Usage: python3 scripts/goldens/dequantize_gguf.py SRC.gguf DST.gguf
"""
import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize


def main(src, dst):
    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(dst, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = GGUFValueType(field.types[0])
        sub = GGUFValueType(field.types[1]) if vtype == GGUFValueType.ARRAY else None
        if name == "general.file_type":
            writer.add_key_value(name, 0, vtype)  # ALL_F32
            continue
        writer.add_key_value(name, field.contents(), vtype, sub)
    for t in reader.tensors:
        data = dequantize(t.data, t.tensor_type).astype(np.float32)
        shape = [int(x) for x in reversed(t.shape)]
        writer.add_tensor(t.name, data.reshape(shape))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
