"""Deep JSON (issue 41): hsdp.checkpoint.open of a checkpoint whose manifest holds a field
nested 10^6 and 10^7 levels deep (arrays and objects) is refused within 2 s naming the depth
limit, with the peak RSS of the Python process under 256 MiB; control bytes planted in the
manifest never reach repr() or an exception's text raw."""

import json
import shutil
import subprocess
import sys

import pytest

import hsdp

LIMIT = "nested deeper than the limit of 64 levels"
PLANT = "".join(chr(c) for c in range(1, 32)) + "\x7f\x1b]0;pwned\x07\x1b[2J"

# Runs in a fresh interpreter: prints wall seconds, peak RSS (KiB) and the error.
PROBE = """
import resource, sys, time
import hsdp
t0 = time.monotonic()
try:
    hsdp.checkpoint.open(sys.argv[1])
    err = "opened"
except hsdp.Error as e:
    err = str(e)
secs = time.monotonic() - t0
print(secs, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, err[:300])
"""


def nested(kind, levels):
    if kind == "arrays":
        return "[" * levels + "]" * levels
    return '{"a":' * levels + "1" + "}" * levels


@pytest.mark.parametrize("kind", ["arrays", "objects"])
@pytest.mark.parametrize("levels", [10**6, 10**7])
def test_deep_manifest_refused(checkpoints, tmp_path, kind, levels):
    src = checkpoints["np1"][0] / "latest"
    d = tmp_path / "deep"
    shutil.copytree(checkpoints["np1"][0] / (src.read_text().strip()), d)
    text = (d / "manifest.json").read_text().rstrip()
    (d / "manifest.json").write_text(text[:-1] + ', "extra": ' + nested(kind, levels) + "}")
    r = subprocess.run([sys.executable, "-c", PROBE, str(d)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    secs, rss_kib, err = r.stdout.split(" ", 2)
    assert LIMIT in err, err
    assert float(secs) < 2, f"{secs} s"
    assert int(rss_kib) < 256 * 1024, f"peak RSS {int(rss_kib) // 1024} MiB"


def shown_by_open(d):
    """What repr() and the errors of opening `d` show."""
    try:
        ck = hsdp.checkpoint.open(d)
        return repr(ck) + repr(list(ck.parameters.values()))
    except hsdp.Error as e:
        return str(e)


@pytest.mark.parametrize("field", ["mode", "created", "param", "file"])
def test_control_bytes_escaped(checkpoints, tmp_path, field):
    src = checkpoints["np1"][0]
    d = tmp_path / "planted"
    shutil.copytree(src / (src / "latest").read_text().strip(), d)
    m = json.loads((d / "manifest.json").read_text())
    if field == "mode":
        m["mesh"]["mode"] = PLANT + m["mesh"]["mode"]
    elif field == "created":
        m["created"] = PLANT
    elif field == "file":
        m["files"][0]["name"] = PLANT + m["files"][0]["name"]
    else:
        m["model"]["units"][0]["params"][0]["name"] = PLANT + "w"
        for t in m["tensors"]:
            if t["unit"] == 0 and t["param"] == 0:
                t["name"] = m["model"]["units"][0]["name"] + "." + PLANT + "w"
    (d / "manifest.json").write_text(json.dumps(m))
    shown = shown_by_open(d)
    assert not any(ord(c) < 0x20 or ord(c) == 0x7F for c in shown), repr(shown)
