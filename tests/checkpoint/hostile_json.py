#!/usr/bin/env python3
"""Hostile JSON for the checkpoint readers (issue 41), made in the test (nothing MB-sized is
committed), and a runner that measures what refusing it costs.

  hostile_json.py deep-manifest GOOD_DIR OUT_DIR arrays|objects LEVELS
      OUT_DIR: a copy of the checkpoint GOOD_DIR whose manifest.json holds one extra field
      nested LEVELS deep
  hostile_json.py deep-safetensors OUT.safetensors arrays|objects LEVELS
      a safetensors file (one F32 tensor) whose header holds a __metadata__ value nested deep
  hostile_json.py deep-index OUT_DIR arrays|objects LEVELS
      OUT_DIR/model.safetensors.index.json nested deep (and its one shard)
  hostile_json.py plant GOOD_DIR OUT_DIR FIELD
      a copy whose manifest has control bytes planted in the string FIELD ("created",
      "mesh.device", "model.units.0.name", ... ; "list" prints every string field's path)
  hostile_json.py plant-safetensors OUT.safetensors FIELD   (name | metadata | dtype)
  hostile_json.py measure MAX_MB MAX_S WANT -- CMD...
      runs CMD, fails unless it exits non-zero within MAX_S seconds, with the peak RSS of CMD
      and its descendants under MAX_MB MiB, and its output naming WANT; prints both
  hostile_json.py clean FILE...
      fails when a file holds a byte below 0x20 other than newline, or 0x7f
"""
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import time

# Every control byte, DEL, an OSC title, a clear-screen and colour codes.
PLANT = "".join(chr(c) for c in range(1, 32)) + "\x7f" + "\x1b]0;pwned\x07\x1b[2J\x1b[31mred\x1b[0m"


def nested(kind, levels):
    if kind == "arrays":
        return "[" * levels + "]" * levels
    return '{"a":' * levels + "1" + "}" * levels


def copy_ckpt(good, out):
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(good, out)
    return os.path.join(out, "manifest.json")


def safetensors(path, header_text):
    header = header_text.encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + b"\0" * 16)


def string_fields(j, path=""):
    if isinstance(j, dict):
        for k, v in j.items():
            yield from string_fields(v, f"{path}.{k}" if path else k)
    elif isinstance(j, list):
        for i, v in enumerate(j):
            yield from string_fields(v, f"{path}.{i}")
    elif isinstance(j, str):
        yield path


def set_field(j, path, fn):
    *head, last = path.split(".")
    for p in head:
        j = j[int(p)] if isinstance(j, list) else j[p]
    key = int(last) if isinstance(j, list) else last
    j[key] = fn(j[key])


def main(a):
    cmd = a[0]
    if cmd == "deep-manifest":
        good, out, kind, levels = a[1], a[2], a[3], int(a[4])
        m = copy_ckpt(good, out)
        text = open(m).read().rstrip()
        assert text.endswith("}")
        with open(m, "w") as f:
            f.write(text[:-1] + ', "extra": ' + nested(kind, levels) + "}")
    elif cmd == "deep-safetensors":
        out, kind, levels = a[1], a[2], int(a[3])
        safetensors(out, '{"__metadata__": {"format": "pt", "x": ' + nested(kind, levels) +
                    '}, "fc0.weight": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}')
    elif cmd == "deep-index":
        out, kind, levels = a[1], a[2], int(a[3])
        os.makedirs(out, exist_ok=True)
        safetensors(os.path.join(out, "model-00001-of-00001.safetensors"),
                    '{"fc0.weight": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}')
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            f.write('{"metadata": {"total_size": 16, "x": ' + nested(kind, levels) +
                    '}, "weight_map": {"fc0.weight": "model-00001-of-00001.safetensors"}}')
    elif cmd == "plant":
        good, out, field = a[1], a[2], a[3]
        j = json.load(open(os.path.join(good, "manifest.json")))
        if field == "list":
            print("\n".join(string_fields(j)))
            return 0
        m = copy_ckpt(good, out)
        set_field(j, field, lambda v: PLANT + v)
        with open(m, "w") as f:
            json.dump(j, f, indent=2)
    elif cmd == "plant-safetensors":
        out, field = a[1], a[2]
        name, meta, dtype = "fc0.weight", "pt", "F32"
        if field == "name":
            name = PLANT + name
        elif field == "metadata":
            meta = PLANT
        else:
            dtype = PLANT
        safetensors(out, json.dumps({"__metadata__": {"format": meta, PLANT: PLANT}, name:
                                     {"dtype": dtype, "shape": [4], "data_offsets": [0, 16]}}))
    elif cmd == "measure":
        max_mb, max_s, want = float(a[1]), float(a[2]), a[3]
        argv = a[a.index("--") + 1:]
        t0 = time.monotonic()
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        secs = time.monotonic() - t0
        rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        out = p.stdout.decode(errors="replace")
        print(f"exit {p.returncode} in {secs:.2f} s, peak RSS {rss_mb:.1f} MiB: {out.strip()[:300]}")
        ok = p.returncode != 0 and secs < max_s and rss_mb < max_mb and want in out
        if not ok:
            print(f"FAIL: want a non-zero exit naming {want!r} within {max_s} s and {max_mb} MiB")
        return 0 if ok else 1
    elif cmd == "clean":
        bad = 0
        for path in a[1:]:
            data = open(path, "rb").read()
            for i, b in enumerate(data):
                if (b < 0x20 and b != 0x0A) or b == 0x7F:
                    print(f"FAIL: {path}: raw byte 0x{b:02x} at {i}: {data[max(0, i - 60):i + 20]!r}")
                    bad += 1
                    break
        return 1 if bad else 0
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
