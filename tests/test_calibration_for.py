"""calibration_for(): every use's one way to this device's calibration. A given calibration is refused unless it
is of the device's GPU model with its SM count; without one, calibrate() runs. On CPU: the device described by a
DeviceInfo (or a stand-in for device_info), the bundled H200 calibration as the map."""
import pytest

from torch_l2topo import CalibrationMismatch, load_example
from torch_l2topo.device import DeviceInfo
from torch_l2topo.measure import calibration

BUNDLED_UUID_HASH = load_example("h200").meta["uuid_hash"]


class _BundledGpu(DeviceInfo):
    """The H200 the bundled calibration was measured on (its raw uuid is not shipped, only the hash)."""

    @property
    def uuid_hash(self) -> str:
        return BUNDLED_UUID_HASH


def _info(name="NVIDIA H200", sm_count=132, same_board=True):
    cls = _BundledGpu if same_board else DeviceInfo
    return cls(index=0, name=name, uuid="GPU-fake", cc=(9, 0), sm_count=sm_count, l2_bytes=62914560,
               total_memory=150109880320, driver="580.159.04", mig=False)


def test_the_bundled_h200_calibration_fits_the_h200_it_was_measured_on():
    calibration.check_calibration(load_example("h200"), _info())
    calibration.check_calibration(load_example("h200"), {"name": "NVIDIA H200", "sm_count": 132})  # no uuid known
    calibration.check_calibration(load_example("h200"), {"name": "NVIDIA H200", "sm_count": 132,
                                                         "uuid_hash": BUNDLED_UUID_HASH})


def test_a_calibration_of_another_h200_is_refused():
    with pytest.raises(CalibrationMismatch, match="another NVIDIA H200"):
        calibration.check_calibration(load_example("h200"), _info(same_board=False))


@pytest.mark.parametrize("device", [_info(name="NVIDIA H100 80GB HBM3"), _info(sm_count=114),
                                    {"name": "NVIDIA H200", "sm_count": 66}, {"name": "NVIDIA B200", "sm_count": 148}])
def test_a_calibration_of_another_gpu_is_refused(device):
    with pytest.raises(CalibrationMismatch, match="calibrate this device"):
        calibration.check_calibration(load_example("h200"), device)


@pytest.fixture
def stand_in_gpu(monkeypatch):
    """cuda:0 is the device `info` describes; calibrate() records its calls and returns the bundled map."""
    calls = []
    state = {"info": _info()}
    monkeypatch.setattr(calibration, "resolve_device", lambda device=None: 0 if device is None else int(device))
    monkeypatch.setattr(calibration, "device_info", lambda index: state["info"])
    monkeypatch.setattr(calibration, "calibrate", lambda index, **options: calls.append((index, options))
                        or load_example("h200"))
    return state, calls


def test_a_given_calibration_of_this_device_is_returned_as_is(stand_in_gpu):
    _, calls = stand_in_gpu
    topo = load_example("h200")
    assert calibration.calibration_for(0, topo) is topo
    assert not calls  # nothing measured


def test_a_given_calibration_of_another_gpu_is_refused_not_measured_around(stand_in_gpu):
    state, calls = stand_in_gpu
    state["info"] = _info(name="NVIDIA H100 80GB HBM3", sm_count=132)  # same SM count, another model
    with pytest.raises(CalibrationMismatch, match="NVIDIA H200 with 132 SMs but the device is NVIDIA H100"):
        calibration.calibration_for(0, load_example("h200"))
    assert not calls


def test_without_a_calibration_the_device_is_calibrated_with_the_options(stand_in_gpu):
    _, calls = stand_in_gpu
    calibration.calibration_for(None, None, backend="triton")
    assert calls == [(0, {"backend": "triton"})]


def test_the_mismatch_is_a_value_error_and_a_package_error():
    """Callers that caught the ValueError the Localizer and partition_map raised before still catch it."""
    from torch_l2topo import L2TopoError

    assert issubclass(CalibrationMismatch, ValueError) and issubclass(CalibrationMismatch, L2TopoError)
