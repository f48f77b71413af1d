"""Topology on real bundled H200 data: save/load round trip, corruption detection, views, validation."""
import json
import zipfile

import numpy as np
import pytest
from test_structure import NOISE, planted

import torch_l2topo
from torch_l2topo import Topology, TopologyFormatError
from torch_l2topo.labelings import best_match_agreement


@pytest.fixture(scope="module")
def h200():
    return torch_l2topo.load_example("h200")


def test_bundled_calibrations_are_real_hopper_measurements():
    names = torch_l2topo.list_examples()
    assert len(names) >= 2
    models = {"h200": "NVIDIA H200", "h100": "NVIDIA H100 80GB HBM3"}
    uuids = set()
    for name in names:
        t = torch_l2topo.load_example(name)
        dev = t.meta["device"]
        assert dev["name"] == models[name.split("-")[0]] and dev["sm_count"] == t.n_sm == 132
        assert t.meta["date"].startswith("20") and t.meta["command"].startswith("python")
        assert dev["uuid"].startswith("sha256:")  # raw hardware ids are not shipped
        assert {"torch", "triton"} <= set(t.meta["versions"])
        uuids.add(t.meta["uuid_hash"])
        # L2 hits on Hopper: a few hundred cycles, at the SM clock the probe inferred (1.98 GHz on the H200s,
        # 1.995 on the H100)
        assert 250 < t.chain_cycles.min() < t.chain_cycles.max() < 320
        assert np.all(np.abs(t.sm_clock_ghz - 1.98) < 0.05)
    assert len(uuids) >= 2  # one calibration from each GPU of a two-GPU machine
    assert {torch_l2topo.load_example(n).meta["backend"] for n in names} == {"cuda", "triton"}


def test_save_load_round_trip(h200, tmp_path):
    h200.extras["demo"] = np.arange(5)
    path = h200.save(tmp_path / "t.npz")
    back = Topology.load(path)
    for name in ("chain_cycles", "chain_ns", "line_cycles", "line_addresses", "chain_noise", "line_noise",
                 "sm_clock_ghz"):
        np.testing.assert_array_equal(getattr(back, name), getattr(h200, name))
    np.testing.assert_array_equal(back.extras["demo"], np.arange(5))
    assert back.meta["device"] == h200.meta["device"]
    del h200.extras["demo"]


def test_digest_names_the_content_alone(h200, tmp_path):
    """One calibration, one digest, wherever it was read from; any changed value or metadata field, another."""
    back = Topology.load(h200.save(tmp_path / "t.npz"))
    assert back.digest() == h200.digest() and len(h200.digest()) == 64
    other = torch_l2topo.load_example("h100")
    assert other.digest() != h200.digest()
    back.line_cycles = back.line_cycles.copy()
    back.line_cycles[3, 7] += 0.125
    assert back.digest() != h200.digest()
    again = Topology.load(tmp_path / "t.npz")
    again.meta["config"] = dict(again.meta["config"], repeats=again.meta["config"]["repeats"] + 1)
    assert again.digest() != h200.digest()


def test_saved_file_holds_no_pickle(h200, tmp_path):
    path = h200.save(tmp_path / "t.npz")
    with np.load(path, allow_pickle=False) as z:
        assert all(z[k].dtype != object for k in z.files)


def _rewrite_member(path, member, transform):
    with zipfile.ZipFile(path) as z:
        items = {n: z.read(n) for n in z.namelist()}
    items[member] = transform(items[member])
    with zipfile.ZipFile(path, "w") as z:
        for n, data in items.items():
            z.writestr(n, data)


def test_altered_array_fails_the_checksum(h200, tmp_path):
    path = h200.save(tmp_path / "t.npz")

    def bump_last_value(raw: bytes) -> bytes:
        return raw[:-1] + bytes([raw[-1] ^ 0x01])

    _rewrite_member(path, "chain_cycles.npy", bump_last_value)
    with pytest.raises(TopologyFormatError, match="checksum"):
        Topology.load(path)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "no_meta", "bad_json", "version"])
def test_damaged_files_are_rejected_with_a_clear_error(h200, tmp_path, damage):
    path = h200.save(tmp_path / "t.npz")
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:1000])
    elif damage == "garbage":
        path.write_bytes(b"not a calibration at all")
    elif damage == "no_meta":
        with zipfile.ZipFile(path) as z:
            items = {n: z.read(n) for n in z.namelist() if n != "meta_json.npy"}
        with zipfile.ZipFile(path, "w") as z:
            for n, data in items.items():
                z.writestr(n, data)
    else:
        def edit_meta(raw):
            header_end = raw.index(b"\n") + 1  # .npy header, then the uint8 JSON bytes
            meta = json.loads(raw[header_end:].decode())
            if damage == "bad_json":
                return raw[:header_end] + b"[" + raw[header_end + 1:]
            meta["format_version"] = 99
            body = json.dumps(meta).encode()
            header = raw[:header_end].replace(str(len(raw) - header_end).encode(), str(len(body)).encode())
            return header + body
        _rewrite_member(path, "meta_json.npy", edit_meta)
    with pytest.raises(TopologyFormatError):
        Topology.load(path)


@pytest.mark.parametrize("content", ["pickled", "garbage"])
def test_a_foreign_or_corrupt_npz_is_not_a_readable_calibration_and_no_pickle_advice(tmp_path, content):
    """numpy's own message advises allow_pickle=, unsafe and useless here: the error must not pass it on."""
    path = tmp_path / "x.npz"
    if content == "pickled":
        np.savez(path, a=np.array([{"an": "object"}], dtype=object))
    else:
        path.write_bytes(b"\x80\x04 not an npz")  # a pickle protocol header: numpy would offer to unpickle it
    with pytest.raises(TopologyFormatError) as info:
        Topology.load(path)
    assert "is not a readable calibration" in str(info.value) and "pickle" not in str(info.value)


def test_source_names_where_a_calibration_was_read_and_is_never_saved(h200, tmp_path):
    assert h200.source == "bundled example h200-1e5731-cuda-waves"
    assert h200.summary().endswith("source: bundled example h200-1e5731-cuda-waves")
    path = h200.save(tmp_path / "copy.npz")
    again = Topology.load(path)
    assert again.source == str(path) and "bundled example" not in again.summary()
    assert "source" not in again.meta
    assert Topology.from_bytes(path.read_bytes()).source is None


def test_repr_is_one_line(h200):
    text = repr(h200)
    assert "\n" not in text and len(text) < 250
    assert text.startswith("Topology(NVIDIA H200, 132 SMs, cuda/waves, measured 2026-11-30T05:53:26+00:00")
    c = h200.chain_cycles
    assert f"{c.min():.1f}/{np.median(c):.1f}/{c.max():.1f} cycles" in text
    model = torch_l2topo.fit_nuca(h200)
    assert "\n" not in repr(model) and len(repr(model)) < 250 and "132 SMs x 512 lines" in repr(model)


def _planted_topology(repeats: int) -> tuple[Topology, dict]:
    m, truth = planted()
    n = m.shape[0]
    return Topology(chain_cycles=m.mean(axis=1), chain_ns=m.mean(axis=1) / 1.98, line_cycles=m.astype(np.float32),
                    line_addresses=truth["addresses"], chain_noise=np.zeros(n),
                    line_noise=np.full(n, NOISE * 0.953873 / 0.707107), sm_clock_ghz=np.full(n, 1.98),
                    meta={"config": {"repeats": repeats}}), truth


def test_sm_frame_carries_each_sms_partition():
    """On a planted map whose partitions are known, the frame's column is the planted side of every SM."""
    topo, truth = _planted_topology(repeats=2)
    column = topo.to_frame("sm")["partition"].to_numpy()
    assert best_match_agreement(column, truth["side"]) == (1.0, {0: 0, 1: 1})
    # one repeat: no repeat noise to tell structure from, so no SM is decided
    single, _ = _planted_topology(repeats=1)
    assert (single.to_frame("sm")["partition"] == -1).all()


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        Topology.load(tmp_path / "nope.npz")


def test_frames_are_tidy(h200):
    sm = h200.to_frame("sm")
    assert len(sm) == 132 and sm["sm"].tolist() == list(range(132))
    np.testing.assert_allclose(sm["chain_cycles"], h200.chain_cycles)
    lines = h200.to_frame("lines")
    assert len(lines) == 132 * h200.n_lines
    row = lines.iloc[h200.n_lines + 3]
    assert (row["sm"], row["line"]) == (1, 3) and row["cycles"] == h200.line_cycles[1, 3]
    with pytest.raises(ValueError):
        h200.to_frame("nope")


def test_summary_fits_a_screen_and_names_the_device(h200):
    text = h200.summary()
    assert "NVIDIA H200" in text and "132 SMs" in text and "cycles per load" in text
    assert len(text.splitlines()) <= 24 and max(map(len, text.splitlines())) <= 160


def test_export_copy_hides_the_uuid(h200):
    h200.meta["device"]["uuid"], real = "GPU-1234", h200.meta["device"]["uuid"]
    try:
        out = h200.export_copy(command="x")
        assert out.meta["device"]["uuid"] == "sha256:" + h200.meta["uuid_hash"] and out.meta["command"] == "x"
        assert h200.meta["device"]["uuid"] == "GPU-1234"
    finally:
        h200.meta["device"]["uuid"] = real


@pytest.mark.parametrize("field,value", [("chain_cycles", np.zeros(3)), ("line_cycles", np.zeros((132, 2, 2))),
                                         ("chain_ns", np.full(132, np.nan))])
def test_inconsistent_arrays_are_rejected(h200, field, value):
    kwargs = {k: getattr(h200, k) for k in ("chain_cycles", "chain_ns", "line_cycles", "line_addresses",
                                            "chain_noise", "line_noise", "sm_clock_ghz")}
    kwargs[field] = value
    with pytest.raises(TopologyFormatError):
        Topology(**kwargs, meta={})


def test_bytes_round_trip_without_a_file(h200, tmp_path):
    data = h200.to_bytes()
    back = Topology.from_bytes(data)
    for name in ("chain_cycles", "chain_ns", "line_cycles", "line_addresses", "chain_noise", "line_noise",
                 "sm_clock_ghz"):
        np.testing.assert_array_equal(getattr(back, name), getattr(h200, name))
    assert back.meta == h200.meta and back.extras.keys() == h200.extras.keys()
    assert h200.save(tmp_path / "t.npz").read_bytes() == data  # a saved file is exactly these bytes
    with pytest.raises(TopologyFormatError, match="sent bytes"):
        Topology.from_bytes(data[:-10], source="sent bytes")
    with pytest.raises(TypeError, match="bytes"):
        Topology.from_bytes("not bytes")


def test_json_view_is_machine_readable(h200):
    doc = json.loads(h200.to_json())
    assert doc["meta"]["device"]["name"] == "NVIDIA H200" and len(doc["chain_cycles"]) == h200.n_sm
    assert doc["line_mean_cycles"] == pytest.approx(h200.line_cycles.mean(axis=0), abs=1e-3)


def test_a_file_that_would_unpack_past_the_cap_is_refused_before_decompressing(h200, tmp_path, monkeypatch):
    from torch_l2topo import topology

    path = h200.save(tmp_path / "t.npz")
    monkeypatch.setattr(topology, "MAX_LOAD_BYTES", 100_000)  # the calibration's arrays take 283 KB

    def no_reading(*args, **kwargs):
        raise AssertionError("a member was decompressed")

    monkeypatch.setattr(np, "load", no_reading)
    with pytest.raises(TopologyFormatError, match=f"{path} would unpack to 0 MiB.*refused before decompressing"):
        Topology.from_bytes(path.read_bytes(), source=str(path))
    monkeypatch.setattr(topology, "MAX_LOAD_BYTES", 50_000)  # the file itself is 90 KB: not even read
    monkeypatch.setattr(type(path), "read_bytes", no_reading)
    with pytest.raises(TopologyFormatError, match=f"{path} is 0 MiB, more than a calibration holds"):
        Topology.load(path)


@pytest.mark.parametrize("field,value,message", [
    ("chain_cycles", -1.0, "chain_cycles holds values <= 0"), ("sm_clock_ghz", 0.0, "sm_clock_ghz holds values <= 0"),
    ("sm_clock_ghz", 50.0, "sm_clock_ghz reaches 50 GHz"), ("line_noise", np.nan, "line_noise holds NaN"),
    ("chain_noise", -0.5, "chain_noise holds values < 0")])
def test_values_no_gpu_measures_are_refused(h200, field, value, message):
    kwargs = {k: getattr(h200, k).copy() for k in ("chain_cycles", "chain_ns", "line_cycles", "line_addresses",
                                                   "chain_noise", "line_noise", "sm_clock_ghz")}
    kwargs[field][7] = value
    with pytest.raises(TopologyFormatError, match=message):
        Topology(**kwargs, meta={})
    with pytest.raises(TopologyFormatError, match="sm_count.* is 100 but the arrays hold 132"):
        Topology(**{**kwargs, field: getattr(h200, field)}, meta={"device": {"sm_count": 100}})
