#!/usr/bin/env python3
"""Copy some tensors of a GGUF file, unchanged, into a small GGUF file (test data for machines
that take only small files, such as the GPU machine: see docs/gpu.md).

usage: scripts/gguf-subset.py IN.gguf OUT.gguf TENSOR_NAME...    (needs `pip install gguf`)
"""
import sys

import gguf


def main() -> None:
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    src, dst, names = sys.argv[1], sys.argv[2], sys.argv[3:]
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"]
    w = gguf.GGUFWriter(dst, bytes(arch.parts[arch.data[0]]).decode())
    by_name = {t.name: t for t in r.tensors}
    for n in names:
        if n not in by_name:
            sys.exit(f"{src} has no tensor {n}")
        t = by_name[n]
        w.add_tensor(n, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
