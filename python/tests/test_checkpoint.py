"""hsdp.checkpoint against independent readers: the --export safetensors that train_gpt wrote,
read by the safetensors package (bit for bit), a reader of the manifest written here with json
and numpy.fromfile (the Adam moments), and hsdp-ckpt's own output for the verbs."""

import json
import os
import shutil
import subprocess

import numpy as np
import pytest
from safetensors.numpy import load_file

import hsdp
from conftest import LAYOUTS, run_json, tool


def manifest_tensor(ckdir, name, state):
    """Tensor `name`'s `state` assembled from the manifest's chunk list ([file, offset, start,
    count, xxh64]) with numpy.fromfile: the format read without hsdp."""
    with open(os.path.join(ckdir, "manifest.json")) as f:
        m = json.load(f)
    files = [os.path.join(ckdir, f["name"]) for f in m["files"]]
    for t in m["tensors"]:
        if t["name"] == name and t["state"] == state:
            out = np.empty(int(np.prod(t["shape"], dtype=np.int64)), dtype="<f4")
            for file, offset, start, count, _ in t["chunks"]:
                out[start:start + count] = np.fromfile(files[file], dtype="<f4", count=count,
                                                       offset=offset)
            return out.reshape(t["shape"])
    raise KeyError(name)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_tensors_equal_the_safetensors_export_bit_for_bit(checkpoints, layout):
    root, export = checkpoints[layout]
    ref = load_file(str(export))
    ck = hsdp.checkpoint.open(root)
    assert ck.step == 2 and ck.mesh["world_size"] == LAYOUTS[layout][0]
    assert sorted(ck.names()) == sorted(ref) and len(ck) == len(ref)
    mapped = 0
    for name in ck:
        a = ck[name]
        b = ref[name]
        assert a.dtype == np.float32 and a.shape == b.shape, name
        assert a.tobytes() == b.tobytes(), name
        assert tuple(ck.parameters[name].shape) == a.shape
        # The same bytes without mapping (assembled through the reader), and without checks.
        assert ck.tensor(name, mmap=False).tobytes() == b.tobytes()
        assert ck.tensor(name, verify=False).tobytes() == b.tobytes()
        mapped += ck.is_contiguous(name)
    if layout == "np1":
        assert mapped == len(ck)  # one rank's file holds every tensor as one run
    else:
        assert mapped < len(ck)  # some tensors are spread over several ranks' files


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_adam_moments_equal_the_files(checkpoints, layout):
    root, _ = checkpoints[layout]
    ck = hsdp.checkpoint.open(root)
    for name in ck.names()[:6] + ck.names()[-3:]:
        st = ck.optimizer_state(name)
        assert set(st) == {"exp_avg", "exp_avg_sq"}
        for s, arr in st.items():
            ref = manifest_tensor(ck.dir, name, s)
            assert arr.shape == ref.shape and arr.tobytes() == ref.tobytes(), (name, s)
        assert (st["exp_avg_sq"] >= 0).all() and np.abs(st["exp_avg"]).max() > 0


def test_mapped_arrays_are_private_and_dlpack_works(checkpoints):
    root, export = checkpoints["np1"]
    ck = hsdp.checkpoint.open(root)
    name = "h.0.attn.c_attn.weight" if "h.0.attn.c_attn.weight" in ck else ck.names()[1]
    a = ck[name]
    orig = a.copy()
    a[...] = 42  # copy on write: this process's pages only
    assert ck[name].tobytes() == orig.tobytes()
    ck.verify()  # the file is unchanged
    b = ck[name]
    d = np.from_dlpack(b)  # DLPack: the same memory, no copy
    assert np.shares_memory(d, b) and d.tobytes() == orig.tobytes()


def test_torch_from_dlpack_without_a_copy(checkpoints):
    torch = pytest.importorskip("torch")  # not a dependency; checked where it is installed
    ck = hsdp.checkpoint.open(checkpoints["np1"][0])
    name = ck.names()[1]
    b = ck[name]
    orig = b.copy()
    t = torch.from_dlpack(b)
    assert t.data_ptr() == b.ctypes.data and t.numpy().tobytes() == orig.tobytes()


def test_inspect_and_verify_equal_hsdp_ckpt(checkpoints):
    root, _ = checkpoints["2x4"]
    cli = run_json([tool("hsdp-ckpt"), "inspect", str(root), "--json"])
    assert hsdp.checkpoint.inspect(root) == cli
    ck = hsdp.checkpoint.open(root)
    info = ck.info()
    assert info["checksums_ok"] is None and all(f["checksum_ok"] is None for f in info["files"])
    assert ck.info(checksums=True) == cli and ck.checksums_ok
    assert ck.mode == cli["mesh"]["mode"] and ck.units == cli["units"]
    hsdp.checkpoint.verify(root)
    ck.verify()


def test_reshard_export_and_diff_are_hsdp_ckpt(checkpoints, tmp_path):
    root, export = checkpoints["np3"]
    # reshard from Python and from the CLI: the same tensors; diff says identical.
    hsdp.checkpoint.reshard(root, tmp_path / "py8", world=8, ranks_per_node=4, intra_shard=4,
                            inter_shard=2, mode="zero3")
    subprocess.run([tool("hsdp-ckpt"), "reshard", str(root), str(tmp_path / "cli8"), "--world", "8",
                    "--ranks-per-node", "4", "--intra-shard", "4", "--inter-shard", "2", "--mode",
                    "zero3"], check=True, capture_output=True)
    a, b = hsdp.checkpoint.open(tmp_path / "py8"), hsdp.checkpoint.open(tmp_path / "cli8")
    assert a.mesh["world_size"] == 8 and a.mesh["inter_shard"] == 2
    d = hsdp.checkpoint.diff(tmp_path / "py8", root)
    assert d.identical and not d and len(d.tensors) == 3 * len(a)
    ref = load_file(str(export))
    for n in a:
        assert a[n].tobytes() == ref[n].tobytes() == b[n].tobytes()
    # export: the same bytes as hsdp-ckpt export, and as train_gpt's own --export.
    files = hsdp.checkpoint.export_safetensors(root, tmp_path / "py.safetensors")
    assert files == [str(tmp_path / "py.safetensors")]
    subprocess.run([tool("hsdp-ckpt"), "export", str(root), str(tmp_path / "cli.safetensors")],
                   check=True, capture_output=True)
    blob = (tmp_path / "py.safetensors").read_bytes()
    assert blob == (tmp_path / "cli.safetensors").read_bytes() == export.read_bytes()
    # bf16 and HF-style shards.
    files = hsdp.checkpoint.export_safetensors(root, tmp_path / "bf.safetensors", dtype="bf16",
                                               max_shard_bytes=200_000)
    assert len(files) > 2 and files[-1].endswith(".safetensors.index.json")


def test_diff_of_different_steps(checkpoints, tmp_path):
    root, _ = checkpoints["np1"]
    from conftest import train_gpt
    train_gpt(1, tmp_path / "c3", tmp_path / "m3.safetensors", ["--batch", "4"], steps=3)
    d = hsdp.checkpoint.diff(root, tmp_path / "c3")
    assert not d.identical and bool(d) and (d.step_a, d.step_b) == (2, 3)
    assert max(t.max_abs for t in d.tensors) > 0
    cli = subprocess.run([tool("hsdp-ckpt"), "diff", str(root), str(tmp_path / "c3")],
                         capture_output=True, text=True)
    assert cli.returncode == 1
    for t in d.tensors[:5]:
        assert t.name in cli.stdout


# ---- bad input: a clear exception, never a crash ----

def copy_ckpt(root, dst):
    src = hsdp.checkpoint.open(root).dir
    shutil.copytree(src, dst)
    return dst


def test_missing_directory(tmp_path):
    with pytest.raises(hsdp.Error, match="nowhere"):
        hsdp.checkpoint.open(tmp_path / "nowhere")
    with pytest.raises(hsdp.Error, match="nowhere"):
        hsdp.checkpoint.inspect(tmp_path / "nowhere")
    with pytest.raises(hsdp.Error):
        hsdp.checkpoint.open(tmp_path)  # a directory that is no checkpoint


def test_name_that_does_not_exist(checkpoints):
    ck = hsdp.checkpoint.open(checkpoints["np3"][0])
    with pytest.raises(KeyError, match="no.such.weight"):
        ck["no.such.weight"]
    with pytest.raises(hsdp.NotFoundError):
        ck.optimizer_state("no.such.weight")
    with pytest.raises(hsdp.InvalidArgumentError, match="exp_avg_cubed"):
        ck.tensor(ck.names()[0], state="exp_avg_cubed")
    assert "no.such.weight" not in ck


def test_corrupt_data_file(checkpoints, tmp_path):
    for layout in ("np1", "2x4"):
        d = copy_ckpt(checkpoints[layout][0], tmp_path / layout)
        ck = hsdp.checkpoint.open(d)
        name = ck.names()[0]  # wte.weight: in every file
        f = d / "data-00000.bin"
        blob = bytearray(f.read_bytes())
        blob[100] ^= 0xFF  # inside the first tensor's first chunk
        f.write_bytes(bytes(blob))
        with pytest.raises(hsdp.InvalidArgumentError, match="checksum") as e:
            ck[name]
        assert "data-00000.bin" in str(e.value)
        with pytest.raises(hsdp.InvalidArgumentError, match="checksum"):
            ck.tensor(name, mmap=False)
        with pytest.raises(hsdp.InvalidArgumentError, match="data-00000.bin"):
            ck.verify()
        assert not ck.checksums_ok
        assert ck.tensor(name, verify=False).size == ck.parameters[name].numel


def test_truncated_and_replaced_files(checkpoints, tmp_path):
    d = copy_ckpt(checkpoints["np3"][0], tmp_path / "t")
    ck = hsdp.checkpoint.open(d)
    with open(d / "data-00001.bin", "r+b") as f:
        f.truncate(1000)
    with pytest.raises(hsdp.InvalidArgumentError, match="truncated"):
        for n in ck:
            ck[n]
    # A data file replaced by a symbolic link is refused unread.
    os.remove(d / "data-00001.bin")
    os.symlink(d / "data-00000.bin", d / "data-00001.bin")
    with pytest.raises(hsdp.Error, match="data-00001.bin"):
        for n in ck:
            ck.tensor(n, mmap=False)


def test_corrupt_manifest(checkpoints, tmp_path):
    d = copy_ckpt(checkpoints["np1"][0], tmp_path / "m")
    text = (d / "manifest.json").read_text()
    (d / "manifest.json").write_text(text[: len(text) // 2])
    with pytest.raises(hsdp.InvalidArgumentError, match="manifest"):
        hsdp.checkpoint.open(d)
    m = json.loads(text)
    m["model"]["units"][0]["params"][0]["shape"] = [1 << 40, 1 << 20]  # a hostile shape
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(hsdp.InvalidArgumentError):
        hsdp.checkpoint.open(d)


def test_bad_verb_arguments(checkpoints, tmp_path):
    root = checkpoints["np1"][0]
    with pytest.raises(hsdp.InvalidArgumentError, match="fp8"):
        hsdp.checkpoint.export_safetensors(root, tmp_path / "x.safetensors", dtype="fp8")
    with pytest.raises(hsdp.InvalidArgumentError, match="zero9"):
        hsdp.checkpoint.reshard(root, tmp_path / "r", world=2, ranks_per_node=2, intra_shard=2,
                                inter_shard=1, mode="zero9")
    with pytest.raises(hsdp.InvalidArgumentError):
        hsdp.checkpoint.reshard(root, tmp_path / "r", world=6, ranks_per_node=4, intra_shard=4,
                                inter_shard=1)
    assert not (tmp_path / "r").exists()  # nothing half-written
    # Never over the checkpoint itself.
    ckdir = hsdp.checkpoint.open(root).dir
    with pytest.raises(hsdp.Error):
        hsdp.checkpoint.export_safetensors(root, os.path.join(ckdir, "manifest.json"))
    hsdp.checkpoint.verify(root)
