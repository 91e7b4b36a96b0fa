"""Before any change: learn the cards of the hosts whose gpus are not set (learn_gpus); stop when a host lacks what
the deploy needs; then settle the Cluster every later phase reads
(the models of llama_models_folder, the planner's split) from the coordinator's model files, and stop when a model
does not fit. Each refusal is one line (refusal.refuse), read from facts only: nothing has changed yet."""

from __future__ import annotations

from dataclasses import replace
from pathlib import PurePosixPath

from pyinfra import host, inventory, logger
from pyinfra.facts.files import Directory, File

from .. import facts, gguf_header, gpus, image, plan, speculation
from . import prepare
from ..cluster import SERVICE_USER, wide_clients
from ..cluster_checks import LEARN_FROM, with_learned
from ..loading import inventory_file
from ..refusal import refuse
from ..settings import COORDINATOR, WORKERS, SettingsError
from ..run import Run


# the fact that lists a host's cards, by image_backend (cluster_checks.LEARN_FROM names the tool)
GPU_FACTS = {"cuda": facts.NvidiaGpus, "vulkan": facts.VulkanGpus}


def learn_gpus(run: Run) -> None:
    """The cards of every host whose gpus are not set, from the host itself (nvidia-smi on a cuda host, vulkaninfo on
    a vulkan one: GPU_FACTS), into the deployment every later step reads (its Cluster, and the images' tags, which
    hold the CUDA architectures); then the checks that wait for them (cluster_checks.with_learned). Every host's first
    step calls it, and it reads every host's fact (inventory.get_host(name).get_fact): pyinfra loads deploy.py for
    every host at once, a greenlet each that yields on each fact read, so no host goes past it before the cards are
    known, whichever host's greenlet gets there first. A host without the tool learns none (a CPU device)."""
    cluster = run.deployment.cluster
    if not cluster.unlearned:
        return  # nothing to learn, or another host's step learned it
    found = {h.name: inventory.get_host(h.name).get_fact(GPU_FACTS[h.backend]) for h in cluster.unlearned}
    if not run.deployment.cluster.unlearned:
        return  # another host's step learned it while this one read the facts
    try:
        learned = with_learned(cluster, found, inventory_file())
    except SettingsError as error:
        refuse(str(error))
    for h in cluster.unlearned:
        cards = learned.host(h.name).gpus
        logger.info(
            f"{h.name}: gpus not set: {LEARN_FROM[h.backend]} lists "
            + (", ".join(f"{g.name} ({g.vram_mib or '?'} MiB)" for g in cards) or "no card: a CPU device")
        )
        for g in cards:
            if g.bandwidth_assumed:
                logger.warning(
                    f"{h.name}: {g.name} is not in llama_rpc_deploy/gpus.py: the planner assumes "
                    f"{g.bandwidth_gbs:g} GB/s of memory bandwidth (a floor: the ceiling and the 'auto' split "
                    f"understate it): set gpus = [{gpus.inventory_entry(g)!r}] with its bandwidth_gbs"
                )
    # (the deployment's one change before settle: run.settle is the coordinator's, after every host's checks)
    run.deployment = replace(run.deployment, cluster=learned, images=image.tags(learned, run.deployment.source))


def host_is_ready(run: Run) -> None:
    """The cards of hosts that list none (learn_gpus); commands, the NVIDIA runtime, free ports, reachable workers;
    a warning where the host's cards differ from those the inventory lists."""
    learn_gpus(run)
    cluster = run.deployment.cluster
    role = cluster.role(host.name)
    me = cluster.host(host.name)
    s = me.settings
    needed = ("docker", "zstd", "systemctl", "bash") + (
        ("iptables", "iptables-restore") if role == WORKERS and s["rpc_firewall"] else ()
    )
    missing = prepare.lacks(me, needed)  # what the prepare phase, which ran first, does not install
    if missing:
        refuse(f"{host.name}: {', '.join(missing)} not found: install them first (Docker Engine, zstd, iptables)")
    listed = (
        f"gpus = {s['gpus']!r} ({me.origins['gpus']})"
        if me.gpus_from == "settings"
        else f"gpus not set and {LEARN_FROM.get(me.backend)} lists {', '.join(g.name for g in me.gpus)}"
    )
    prepared = prepare.sets_up(me) == "nvidia"  # it sets up Docker's nvidia runtime, or refused a host without a driver
    if me.gpus and me.backend == "cuda" and not prepared and "nvidia" not in host.get_fact(facts.DockerRuntimes):
        refuse(
            f"{host.name}: image_backend = 'cuda' ({me.origins['image_backend']}) and {listed} but Docker has no "
            "nvidia runtime: expected the NVIDIA Container Toolkit (nvidia-ctk runtime configure --runtime=docker)"
        )
    if me.gpus and me.backend == "vulkan" and not host.get_fact(facts.RenderNodes):
        refuse(
            f"{host.name}: image_backend = 'vulkan' ({me.origins['image_backend']}) and {listed} but no Vulkan "
            "device: no /dev/dri/renderD* on the host: expected the GPU's kernel driver loaded (amdgpu, i915, xe), "
            "or gpus = [] for the CPU's Vulkan device (lavapipe)"
        )
    if me.gpus_from == "settings" and me.backend in GPU_FACTS:  # what the inventory says wins; a difference warns
        difference = gpus.mismatch(me.gpus, host.get_fact(GPU_FACTS[me.backend]), LEARN_FROM[me.backend])
        if difference:
            logger.warning(
                f"{host.name}: {difference} ({me.origins['gpus']}): the plan and the device order follow gpus"
            )
    # the ports and what may hold them: ours, or (llama_port, on an upgrade from before the front) llama-server
    ports = (
        {
            "llama_port": ("the front", {"haproxy", "llama-server"}),
            "llama_server_port": ("llama-server", {"llama-server"}),
        }
        if role == COORDINATOR
        else {"rpc_port": ("rpc-server", {"rpc-server"})}
    )
    ports = [(key, s[key], ours, names) for key, (ours, names) in ports.items()]
    tunnels = cluster.tunnels_at(me)
    if tunnels:
        tunnel_is_possible(tunnels[0].origins["rpc_transport"])
        ports += (
            [("rpc_tunnel_local_port", w.tunnel_end, f"the tunnel to {w.name}", {"stunnel4"}) for w in tunnels]
            if role == COORDINATOR
            else [("rpc_tunnel_port", s["rpc_tunnel_port"], "the tunnel", {"stunnel4"})]
        )
    for key, port, ours, names in ports:
        listener = host.get_fact(facts.TcpListener, port=port)
        if listener is not None and listener not in names:
            refuse(
                f"{host.name}: port {port} is taken by {listener or 'another process'}: "
                f"expected it free for {ours} (change {key})"
            )
    if role == WORKERS and not me.tunnelled:
        logger.warning(
            f"{host.name}: rpc_transport: plain: rpc-server at {me.rpc_remote} has no authentication, and the "
            "firewall rule admits whoever holds the coordinator's address (any device on the LAN can take "
            "it): set rpc_transport: tunnel"
        )
    if role == COORDINATOR:
        for worker in cluster.workers:
            if not host.get_fact(facts.TcpReachable, address=worker.address, port=worker.transfer_port):
                refuse(
                    f"{host.name} cannot reach {worker.name}'s sshd at {worker.address}:{worker.transfer_port}: "
                    "the coordinator sends the image that way (set address or transfer_ssh_port)"
                )
    if role == WORKERS and s["rpc_firewall"] and s["rpc_allow_wide"] and wide_clients(cluster, me):
        logger.warning(
            f"{host.name}: rpc_allow_from admits {', '.join(wide_clients(cluster, me))} to rpc-server's port "
            f"{s['rpc_port']} (rpc_allow_wide): rpc-server has no authentication, anyone there can read "
            "and write this host's GPU memory and crash the server"
        )
    if role == WORKERS and not host.get_fact(facts.SshHostKey):
        refuse(f"{host.name}: no /etc/ssh/ssh_host_ed25519_key.pub: the coordinator needs it to send the image")


def tunnel_is_possible(origin: str) -> None:
    """stunnel is there, or apt-get to install Debian's stunnel4 (the deploy does, as it installs HAProxy)."""
    missing = host.get_fact(facts.MissingCommands, names=("stunnel4", "apt-get")) or []  # None: nothing missing
    if "stunnel4" in missing and "apt-get" in missing:
        refuse(
            f"{host.name}: rpc_transport = 'tunnel' ({origin}) needs stunnel4, "
            "which is not installed, and there is no apt-get to install it: expected stunnel 5 "
            "(TLS 1.3) as /usr/bin/stunnel4, or rpc_transport: plain"
        )


def settle(run: Run) -> None:
    """The Cluster that every later phase of the coordinator reads, settled once per run, on the coordinator after
    its own checks, from its files: llama_models_folder's models join llama_models, every model and projector file
    is readable by the service user, and the planner, on each model's header (with its own settings), refuses what
    won't fit, warns on what measured slow, and resolves llama_tensor_split = 'auto'. The coordinator's step alone:
    pyinfra loads deploy.py for every host at once (a greenlet each, which yields on every fact read), and what is
    settled here (the models, the split) is in the coordinator's files only, none of a worker's."""
    cluster = run.deployment.cluster
    if cluster.settings["llama_models_folder"]:
        folder = str(PurePosixPath(cluster.settings["llama_model_path"]).parent)
        try:
            cluster = cluster.with_folder(host.get_fact(facts.GgufFiles, folder=folder))
        except SettingsError as error:
            refuse(str(error))
    for name in cluster.model_names():
        view = cluster.for_model(name)
        for key in MODEL_FILES:
            if view.settings[key]:
                file_is_readable(view.coordinator, key)
    settled = []
    for name in cluster.model_names():  # one model: no name in the log lines and errors, as before llama_models
        view, model = cluster.for_model(name), name if cluster.router else None
        capacity = model_fits(view, model)
        if view.settings["llama_tensor_split"] == "auto":
            settled.append(("llama_tensor_split", capacity.split, model))
        if capacity.draft:  # the draft's own type, as its file says; an assistant by the KV it reads
            settled += [(k, v, model) for k, v in speculation.settled(view.settings, capacity.draft).items()]
    for key, value, model in settled:
        cluster = cluster.with_setting(key, value, model)
    run.settle(replace(run.deployment, cluster=cluster))


# the files of a model on the coordinator, and how the planner reads each one's header
MODEL_FILES = {
    "llama_model_path": gguf_header.read_model,
    "llama_mmproj_path": gguf_header.projector_bytes,
    "llama_spec_draft_path": gguf_header.read_model,
}


def file_is_readable(me, key: str) -> None:
    """A model or projector file is on the coordinator (this host), readable by the service user."""
    model, where = me.settings[key], me.origins[key]
    found = host.get_fact(File, path=model)
    if not found:
        refuse(f"{where}: {key} = {model!r}: no such file on the coordinator {host.name}")
    folder = host.get_fact(Directory, path=str(PurePosixPath(model).parent))
    if not (int(str(found["mode"]), 8) & 0o004 and folder and int(str(folder["mode"]), 8) & 0o005 == 0o005):
        refuse(
            f"{where}: {key} = {model!r}: llama-server runs as the unprivileged user "
            f"{SERVICE_USER}, which cannot read it on {host.name}: expected the file readable by "
            "others and its folder listable (chmod o+r FILE; chmod o+rx FOLDER)"
        )


def model_fits(cluster, name: str | None) -> plan.CapacityPlan:
    """The planner on one model's header, read on the coordinator (this host), with that model's settings: its table in
    the log, and a refusal of what won't fit."""
    models = {}
    for key, read in MODEL_FILES.items():
        path = cluster.settings[key]
        if not path:
            continue
        try:
            models[key] = gguf_header.read_remote_model(
                lambda file, limit: host.get_fact(facts.GgufHeader, path=file, limit=limit), path, read
            )
        except Exception as error:  # not a GGUF file, a shard missing
            refuse(f"{cluster.coordinator.origins[key]}: {key} = {path!r}: {error}")
    # each card's memory as its host's nvidia-smi reports it, where it does
    reported = {
        h.name: [found.vram_mib for found in inventory.get_host(h.name).get_fact(facts.NvidiaGpus)]
        for h in cluster.hosts
        if h.gpus and h.backend == "cuda"
    }
    draft = models.get("llama_spec_draft_path")
    problem = speculation.files_problem(cluster.settings["llama_spec_type"], models["llama_model_path"], draft)
    if problem:
        key = "llama_spec_draft_path" if draft else "llama_spec_type"
        refuse((f"model {name!r}: " if name else "") + f"{cluster.coordinator.origins[key]}: {problem}")
    capacity = plan.plan_cluster(
        cluster,
        models["llama_model_path"],
        reported=reported,
        mmproj_bytes=models.get("llama_mmproj_path", 0),
        draft=draft,
    )
    for line in capacity.table().splitlines():
        logger.info(f"    [plan{f' {name}' if name else ''}] {line}")
    if capacity.problems:
        refuse(
            (f"model {name!r}: " if name else "") + "; ".join(capacity.problems) + " (llama-rpc plan shows the table)"
        )
    return capacity
