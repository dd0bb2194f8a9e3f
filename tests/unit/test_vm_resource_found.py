"""gpukit_vm's GPUs: the configuration's when it sets them (every kit env but ssh), else what the backend
found on the machine (the ssh backend's host checks), recorded in the state: never a known planned value
changed at apply (terraform would refuse the result)."""
from __future__ import annotations

from tf.types import Unknown

from glue.cloud.base import VMRecord
from glue.tfprovider.vm_resource import VMResource

REC = VMRecord(id="box-3", name="gpukit-2", ssh_host="10.0.0.7", ssh_port=22, ssh_user="root", host_key="k",
               gpu_type="a10", gpu_count=2, backend="ssh", status="running")


def test_unset_gpus_are_the_backends() -> None:
    for unset in (Unknown, None):
        state = VMResource._state({"name": "gpukit-2", "gpu_type": unset, "gpu_count": unset}, REC)
        assert (state["gpu_type"], state["gpu_count"], state["id"]) == ("a10", 2, "box-3")


def test_configured_gpus_stay_as_planned() -> None:
    state = VMResource._state({"name": "gpukit-2", "gpu_type": "h100", "gpu_count": 8}, REC)
    assert (state["gpu_type"], state["gpu_count"]) == ("h100", 8)


def test_the_schema_makes_them_optional_and_computed() -> None:
    attrs = {a.name: a for a in VMResource.get_schema().attributes}
    for name in ("gpu_type", "gpu_count"):
        assert attrs[name].optional and attrs[name].computed and attrs[name].default is Unknown
