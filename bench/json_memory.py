#!/usr/bin/env python3
"""Memory per input byte of hsdp's JSON reader (docs/checkpoint.md, "File rules"), end to end:
hsdp-ckpt inspect of a directory whose manifest.json is a document of one shape, about SIZE MB
(default 24). The reader checks it, builds its tree, and the manifest's first check refuses it
(it is not an hsdp manifest); the peak RSS (/usr/bin/time %M) less that of the same command on
a 2-byte document, over the document's bytes, is K: the text read plus the tree.

  bench/json_memory.py BUILD_DIR [SIZE_MB]
"""
import os
import subprocess
import sys
import tempfile

SHAPES = {
    "[{},{},...]": lambda n: "[" + ",".join(["{}"] * (n // 3)) + "]",
    '["","",...]': lambda n: "[" + ",".join(['""'] * (n // 3)) + "]",
    "[[],[],...]": lambda n: "[" + ",".join(["[]"] * (n // 3)) + "]",
    "[0,0,...]": lambda n: "[" + ",".join(["0"] * (n // 2)) + "]",
    '{"0":0,"1":0,...}': lambda n: "{" + ",".join('"%x":0' % i for i in range(n // 9)) + "}",
    '[{"a":[1,2],"b":"x"},...]': lambda n: "[" + ",".join(['{"a":[1,2],"b":"x"}'] * (n // 20)) + "]",
    "strings of 16 bytes": lambda n: "[" + ",".join(['"' + "a" * 16 + '"'] * (n // 19)) + "]",
}


def peak_kib(ckpt, d):
    r = subprocess.run(["/usr/bin/time", "-f", "%M", ckpt, "inspect", d],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return int(r.stderr.strip().splitlines()[-1])


def main():
    build = sys.argv[1]
    size = int(float(sys.argv[2]) * 1e6) if len(sys.argv) > 2 else 24_000_000
    ckpt = os.path.join(build, "tools", "hsdp-ckpt")
    with tempfile.TemporaryDirectory() as d:
        m = os.path.join(d, "manifest.json")
        open(m, "w").write("[]")
        base = peak_kib(ckpt, d)
        print(f"| shape | bytes | peak RSS over the baseline | K (bytes per byte) |")
        print(f"| --- | ---: | ---: | ---: |")
        for name, make in SHAPES.items():
            text = make(size)
            open(m, "w").write(text)
            kib = peak_kib(ckpt, d) - base
            print(f"| `{name}` | {len(text)} | {kib / 1024:.1f} MiB | {kib * 1024 / len(text):.1f} |")


if __name__ == "__main__":
    main()
