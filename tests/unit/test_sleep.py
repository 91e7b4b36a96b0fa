"""The workers' sleep, offline: what the deploy reads about a worker's NIC and refuses, the files it renders for
llama-sleep.py and the workers, and how `status` shows a sleeping cluster. (The daemon itself runs for real against
the front in tests/front/test_sleep.py, and on the lab in tests/e2e/test_lab_sleep.py.)"""

import json
import time

from llama_rpc_deploy import render, roles, sleep, status
from llama_rpc_deploy.sleep import Nic, nic_of, nic_problem

from .helpers import cluster

# What facts.WakeNic prints: on a desktop's Intel NIC (ethtool 6.1's lines with "Wake-on"), and on a veth
# (a lab host's, or a container's: ethtool lists no Wake-on at all)
INTEL = [
    "interface eno1",
    "exists yes",
    "mac 3C:7C:3F:12:34:56",
    "broadcast 192.168.1.255",
    "ethtool yes",
    "\tSupports Wake-on: pumbg",
    "\tWake-on: d",
]
VETH = ["interface eth0", "exists yes", "mac 02:42:ac:1e:39:0b", "broadcast 172.30.57.255", "ethtool yes"]
NO_SUCH = ["interface wlan9", "exists no", "ethtool yes"]
SLEEPY = {"sleep_idle_seconds": 900}


def worker(data=None, all_data=SLEEPY):
    return cluster(workers=[data], all_data=all_data).workers[0]


def test_a_nic_as_the_worker_reports_it():
    nic = nic_of(INTEL)
    assert nic == Nic("eno1", "3c:7c:3f:12:34:56", "192.168.1.255", exists=True, wake_on="pumbg", ethtool=True)
    assert nic_of(VETH).wake_on is None and nic_of(NO_SUCH).exists is False


def test_a_nic_that_can_wake_on_a_magic_packet_passes():
    assert nic_problem(worker(), nic_of(INTEL)) is None


def test_a_nic_that_cannot_wake_is_refused_in_one_line():
    problem = nic_problem(worker(), nic_of(VETH))
    assert "10.0.0.20's eth0 cannot wake on a magic packet (ethtool: Supports Wake-on: nothing, 'g' needed)" in problem
    assert "\n" not in problem
    only_phy = nic_of([*VETH, "\tSupports Wake-on: pumb"])  # wakes on link activity and the like, not on 'g'
    assert "Supports Wake-on: pumb, 'g' needed" in nic_problem(worker(), only_phy)


def test_an_interface_the_worker_lacks_is_refused_naming_the_setting():
    w = worker({"wol_interface": "wlan9"})
    problem = nic_problem(w, sleep.chosen(w, nic_of(NO_SUCH)))
    assert "wol_interface 'wlan9': 10.0.0.20 has no such network interface" in problem


def test_without_ethtool_the_nic_is_not_taken_on_trust():
    problem = nic_problem(worker(), nic_of([line for line in VETH if "ethtool" not in line] + ["ethtool no"]))
    assert "ethtool is missing" in problem and "wol_check_nic: False" in problem


def test_wol_check_nic_false_trusts_the_user_and_the_inventory_wins():
    w = worker({"wol_check_nic": False, "wol_mac": "AA:BB:CC:DD:EE:FF", "wol_broadcast": "10.9.9.255"})
    nic = sleep.chosen(w, nic_of(VETH))
    assert nic_problem(w, nic) is None
    assert (nic.mac, nic.broadcast, nic.interface) == ("aa:bb:cc:dd:ee:ff", "10.9.9.255", "eth0")


def test_the_sleep_line_is_the_mode_or_the_users_command_quoted():
    assert sleep.sleep_line(worker()) == "systemctl suspend"
    assert sleep.sleep_line(worker({"sleep_mode": "hibernate"})) == "systemctl hibernate"
    assert sleep.sleep_line(worker({"sleep_command": ["bash", "-c", "echo x > /dev/udp/10.0.0.1/9"]})) == (
        "bash -c 'echo x > /dev/udp/10.0.0.1/9'"
    )


def test_the_daemons_settings_name_each_worker_its_mac_and_its_tunnel_end():
    c = cluster(workers=[None, {"transfer_ssh_port": 2222}], all_data={**SLEEPY, "sleep_wake_timeout": 45})
    nics = {w.name: nic_of(INTEL) for w in c.workers}
    files = render.sleep_files(c, nics)
    config = json.loads(files["/opt/llama-rpc/llama-sleep.json"])
    assert (config["idle_seconds"], config["wake_timeout"], config["socket"]) == (900, 45, roles.FRONT_SOCKET)
    assert [w["endpoint"] for w in config["workers"]] == ["127.0.0.1:50100", "127.0.0.1:50101"]  # the tunnels
    assert {w["mac"] for w in config["workers"]} == {"3c:7c:3f:12:34:56"}
    second = config["workers"][1]["sleep"]
    assert second[:3] == ["ssh", "-i", roles.SLEEP_KEY] and second[-3:] == ["2222", "root@10.0.0.21", "sleep"]
    assert f"UserKnownHostsFile={roles.KNOWN_HOSTS}" in second  # the workers' host keys the image transfer checks
    assert config["stop_server"] == ["systemctl", "stop", roles.COORDINATOR_UNIT]
    unit = files[f"{roles.UNIT_DIR}/{roles.SLEEP_UNIT}"]
    assert 'ExecStart=/usr/bin/python3 "/opt/llama-rpc/llama-sleep.py" run' in unit
    assert roles.SLEEP_UNIT in roles.coordinator(c).units


def test_the_worker_gets_its_sleep_command_and_wake_on_lan_at_boot():
    c = cluster(all_data=SLEEPY)
    files = render.worker_sleep_files(c, c.workers[0], nic_of(INTEL))
    assert files["/opt/llama-rpc/sleep-now.env"] == "SLEEP_COMMAND='systemctl suspend'\n"
    link = files[roles.WOL_LINK]
    assert "MACAddress=3c:7c:3f:12:34:56" in link and "WakeOnLan=magic" in link
    assert "NamePolicy=keep kernel database onboard slot path" in link  # the NIC keeps its name
    unchecked = cluster(workers=[{"wol_check_nic": False}], all_data=SLEEPY)
    assert roles.WOL_LINK not in render.worker_sleep_files(unchecked, unchecked.workers[0], nic_of(VETH))


def test_sleep_off_renders_nothing_and_adds_no_unit():
    c = cluster()
    assert render.sleep_files(c, {}) == {} and render.worker_sleep_files(c, c.workers[0], None) == {}
    assert roles.SLEEP_UNIT not in roles.coordinator(c).units
    assert not status.parse("10.0.0.10", "coordinator", "== sleep\n").sleep  # no state file: nothing shown


STATE = {
    "idle_seconds": 900,
    "asleep_since": 1_000_000.0,
    "workers": {"10.0.0.20": {"asleep": True, "since": 1_000_001.0}},
    "wakes": [time.time() - 3600, time.time() - 90000],
    "last_wake": {"at": time.time() - 3600, "hello_s": 6.1, "ready_s": 9.4, "first_answer_s": 10.2, "asked": 0},
    "failed": None,
}


def test_status_shows_a_sleeping_cluster_as_well_and_names_a_failed_wake():
    c = cluster(all_data=SLEEPY)
    script = status.host_script(c, c.coordinator)
    assert f"cat {roles.SLEEP_STATE}" in script
    output = "== unit llama-server.service\ninactive\n== unit llama-front.service\nactive\n== sleep\n" + json.dumps(
        STATE, indent=1
    )
    coordinator = status.parse("10.0.0.10", "coordinator", output)
    coordinator.api = "asleep"
    sleeping = status.HostStatus(name="10.0.0.20", role="workers", sleep=STATE["workers"]["10.0.0.20"])
    assert coordinator.ok and sleeping.ok  # llama-server stopped on purpose
    text = status.table([coordinator, sleeping])
    assert "wakes in the last 24 h: 1" in text
    assert (
        "every worker answered 6.1 s after the first magic packet, llama-server up 9.4 s and its first answer" in text
    )
    assert "10.0.0.20 (workers)\n  asleep since" in text and text.endswith("all well")
    failed = dict(
        STATE, failed={"at": 1_000_100.0, "workers": ["10.0.0.20"], "message": "worker 10.0.0.20 did not wake"}
    )
    broken = status.parse("10.0.0.10", "coordinator", output.split("== sleep")[0] + "== sleep\n" + json.dumps(failed))
    assert not broken.ok and "LAST WAKE FAILED" in status.table([broken])
    awake = status.parse("10.0.0.10", "coordinator", output.replace("inactive", "failed").split("== sleep")[0])
    assert not awake.ok  # without sleep, a stopped llama-server is what it always was: wrong
