"""Reads hsdp's checkpoint and its safetensors exports with other implementations: the checkpoint
through its manifest and data files with numpy (docs/checkpoint.md is all this needs), the
exports with the `safetensors` package (single files and an HF-style sharded index), and
checks them bit for bit against each other; bf16 against numpy's own round-to-nearest-even.

    export_check.py CKPT_DIR FP32.safetensors BF16.safetensors SHARDED_INDEX.json
"""
import json
import os
import sys

import numpy as np
from safetensors.numpy import load_file


def read_checkpoint(d):
    m = json.load(open(os.path.join(d, "manifest.json")))
    assert m["format"] == "hsdp-checkpoint" and m["format_version"] == 1, m["format_version"]
    files = [np.memmap(os.path.join(d, f["name"]), dtype=np.uint8, mode="r") for f in m["files"]]
    out = {}
    for t in m["tensors"]:
        if t["state"] != "param":
            continue
        n = int(np.prod(t["shape"]))
        v = np.empty(n, dtype="<f4")
        covered = 0
        for f, off, start, count, _ in t["chunks"]:
            assert off % 64 == 0, "chunk not 64-byte aligned"
            v[start:start + count] = files[f][off:off + 4 * count].view("<f4")
            covered += count
        assert covered == n, (t["name"], covered, n)
        out[t["name"]] = v.reshape(t["shape"])
    return out


def bf16_bits(x):
    u = x.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    rounded[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def main():
    ckpt, fp32, b16, index = sys.argv[1:5]
    want = read_checkpoint(ckpt)
    got = load_file(fp32)
    assert sorted(got) == sorted(want), (sorted(got), sorted(want))
    for k, v in want.items():
        assert got[k].dtype == np.float32 and got[k].shape == v.shape, k
        assert got[k].tobytes() == v.tobytes(), f"{k}: export differs from the checkpoint"
    from safetensors import safe_open
    with safe_open(b16, framework="numpy") as f:
        # numpy has no bfloat16: read the raw bytes after the header instead.
        keys = list(f.keys())
    raw = open(b16, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    assert sorted(keys) == sorted(want)
    for k, v in want.items():
        h = header[k]
        assert h["dtype"] == "BF16" and h["shape"] == list(v.shape), k
        b, e = h["data_offsets"]
        bits = np.frombuffer(raw[8 + n + b:8 + n + e], dtype="<u2")
        assert np.array_equal(bits, bf16_bits(v.reshape(-1))), f"{k}: bf16 rounding differs"
    idx = json.load(open(index))
    shards = sorted(set(idx["weight_map"].values()))
    assert len(shards) > 1, shards
    seen = {}
    for s in shards:
        for k, v in load_file(os.path.join(os.path.dirname(index), s)).items():
            assert idx["weight_map"][k] == s
            seen[k] = v
    assert sorted(seen) == sorted(want)
    for k, v in want.items():
        assert seen[k].tobytes() == v.tobytes(), f"{k}: sharded export differs"
    total = sum(v.nbytes for v in want.values())
    assert idx["metadata"]["total_size"] == total
    print(f"export_check: {len(want)} tensors, {total} bytes: fp32, bf16 and {len(shards)} shards "
          "match the checkpoint bit for bit")


main()
