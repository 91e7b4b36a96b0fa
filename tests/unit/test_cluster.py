import re

import pytest

from llama_rpc_deploy import image
from llama_rpc_deploy.cluster import cuda_architectures
from llama_rpc_deploy.image import FILES
from llama_rpc_deploy.settings import SettingsError
from llama_rpc_deploy.source import Source

from .helpers import LOCAL, REF, cluster


def test_seed_pair_remote_first_local_last():
    c = cluster()
    assert c.devices == ["RPC0", "CUDA0"]
    # llama-server reaches the worker through its tunnel's end on the coordinator; the tunnel leads to the
    # worker's TLS port, and rpc-server listens on the worker's loopback
    assert c.rpc_endpoints == ["127.0.0.1:50100"]
    assert (c.workers[0].rpc_remote, c.workers[0].rpc_bind, c.workers[0].exposed_port) == (
        "10.0.0.20:50053",
        "127.0.0.1",
        50053,
    )
    assert cuda_architectures(c) == "89;120"


def test_workers_with_several_gpus_and_a_cpu_worker():
    c = cluster(
        workers=[{"gpus": ["RTX 3090", "RTX 3090"]}, {"gpus": []}], coordinator={"gpus": ["RTX 5090", "RTX 4090"]}
    )
    assert c.devices == ["RPC0", "RPC1", "RPC2", "CUDA0", "CUDA1"]
    assert cuda_architectures(c) == "86;89;120"


def test_worker_address_and_rpc_host_override_the_endpoint():
    plain = {"rpc_transport": "plain"}
    c = cluster(workers=[{"address": "10.1.0.5", "rpc_port": 50060, **plain}, {"rpc_host": "10.2.0.6", **plain}])
    assert c.rpc_endpoints == ["10.1.0.5:50060", "10.2.0.6:50052"]
    assert [w.rpc_bind for w in c.workers] == ["10.1.0.5", "10.2.0.6"] and not c.tunnelled
    c = cluster(
        workers=[{"address": "10.1.0.5", "rpc_tunnel_port": 50060}, {"rpc_host": "10.2.0.6"}],
        all_data={"rpc_tunnel_local_port": 40000},
    )
    assert c.rpc_endpoints == ["127.0.0.1:40000", "127.0.0.1:40001"]
    assert [w.rpc_remote for w in c.workers] == ["10.1.0.5:50060", "10.2.0.6:50053"]


def test_one_transport_for_every_worker():
    with pytest.raises(
        SettingsError,
        match="rpc_transport = 'plain' on 10.0.0.21, 'tunnel' on 10.0.0.20: expected one "
        "rpc_transport for every worker",
    ):
        cluster(workers=[None, {"rpc_transport": "plain"}])


@pytest.mark.parametrize(
    "worker,coordinator,words",
    [
        ({"rpc_tunnel_port": 50052}, {}, "rpc_tunnel_port = 50052 on 10.0.0.20 is its rpc_port: expected another port"),
        ({"rpc_tunnel_port": 2222, "ssh_port": 2222}, {}, "rpc_tunnel_port = 2222 on 10.0.0.20 is its SSH port"),
        (
            {"rpc_tunnel_port": 443},
            {},
            "rpc_tunnel_port = 443: expected an integer from 1024 to 65535",
        ),  # stunnel is no root
        (
            {},
            {"rpc_tunnel_local_port": 8080},
            "rpc_tunnel_local_port = 8080 puts 10.0.0.20's tunnel end on the coordinator at port 8080 (llama_port)",
        ),
    ],
)
def test_tunnel_ports_stay_apart(worker, coordinator, words):
    with pytest.raises(SettingsError, match=re.escape(words)):
        cluster(workers=[worker], coordinator=coordinator)


def test_tensor_split_must_match_device_count():
    with pytest.raises(
        SettingsError, match=r"llama_tensor_split = \[1, 1, 1\]: expected 2 numbers, one per device \(RPC0, CUDA0\)"
    ):
        cluster(all_data={"llama_tensor_split": [1, 1, 1]})
    assert cluster(all_data={"llama_tensor_split": [1, 1]}).settings["llama_tensor_split"] == [1, 1]


def test_inventory_shape():
    with pytest.raises(SettingsError, match="group workers is empty"):
        cluster(workers=())
    with pytest.raises(SettingsError, match="10.0.0.10 is listed twice"):
        cluster(names=["10.0.0.10", "10.0.0.10"])
    with pytest.raises(SettingsError, match="rpc endpoint 10.0.0.5:50053 is used by two workers"):
        cluster(workers=[{"address": "10.0.0.5"}, {"address": "10.0.0.5"}])


def test_placeholder_model_path_is_refused():
    with pytest.raises(
        SettingsError, match="group_data/all.py: llama_model_path = '/CHANGE_ME/m.gguf': expected the path"
    ):
        cluster(all_data={"llama_model_path": "/CHANGE_ME/m.gguf"})


def test_cuda_too_old_for_blackwell_is_refused():
    with pytest.raises(SettingsError, match=r"CUDA 12.4 cannot build for sm_120: expected CUDA 12.8 or newer"):
        cluster(all_data={"image_build_image": "nvidia/cuda:12.4.1-devel-ubuntu22.04"})


def test_cuda_build_needs_gpus():
    with pytest.raises(SettingsError, match="no host lists gpus"):
        cluster(coordinator={"gpus": []}, workers=[{"gpus": []}])


def test_unknown_gpu_names_the_table():
    with pytest.raises(SettingsError, match="unknown GPU 'RTX 9999'"):
        cluster(workers=[{"gpus": ["RTX 9999"]}])


def test_build_args_cuda_and_cpu():
    args = image.build_args(cluster(), REF)
    assert args["GGML_BACKEND"] == "cuda" and args["CUDA_ARCHITECTURES"] == "89;120"
    assert args["BUILD_IMAGE"].startswith("nvidia/cuda:12.8") and args["GGML_NATIVE"] == "OFF"
    assert args["LLAMA_CPP_REF"] == "0c1e57098bba43ac29e6e3b677cdceebdd22334f" and args["LLAMA_BUILD_NUMBER"] == "11312"
    cpu = image.build_args(
        cluster(
            coordinator={"gpus": []},
            workers=[{"gpus": []}],
            all_data={"image_backend": "cpu", "image_cpu_native": True},
        ),
        LOCAL,
    )
    assert cpu["GGML_BACKEND"] == "cpu" and "CUDA_ARCHITECTURES" not in cpu and cpu["GGML_NATIVE"] == "ON"
    # a local tree is taken for llama_cpp_ref (its version); its own sha256 is what the image records
    assert cpu["SOURCE_SHA256"] == "a" * 64 and cpu["LLAMA_CPP_REF"] == "0c1e57098bba43ac29e6e3b677cdceebdd22334f"


def test_every_build_arg_is_declared_in_the_dockerfile():
    dockerfile = (FILES / "Dockerfile").read_text()
    args = image.build_args(cluster(all_data={"image_build_jobs": 4}), REF) | image.build_args(cluster(), LOCAL)
    for key in args:
        assert f"ARG {key}" in dockerfile, key


def test_image_tag_is_stable_and_follows_every_input():
    base = image.tag(cluster(), REF)
    assert base == image.tag(cluster(), REF)
    assert base.startswith("llama-rpc:b11312-")
    assert image.tag(cluster(all_data={"llama_cpp_build_number": 11313}), REF) != base
    assert image.tag(cluster(all_data={"image_cuda_architectures": "86"}), REF) != base
    assert image.tag(cluster(), Source(ident="other", local_tarball=None, url="u")) != base
    assert image.tag(cluster(), LOCAL).startswith("llama-rpc:local-")
