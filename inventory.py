# Your machines. Replace the example addresses (RFC 5737, they reach nothing) with yours,
# list each host's NVIDIA GPUs, and run:  pyinfra inventory.py deploy.py
# The local lab writes its own inventory (.lab/inventory.py) in this same form.
SSH = {"ssh_user": "root"}

coordinator = [
    # runs llama-server; the model file lives here
    ("192.0.2.10", {**SSH, "gpus": ["RTX 4080"]}),
]

workers = [
    # run rpc-server; add as many as you have
    ("192.0.2.20", {**SSH, "gpus": ["RTX 5060 Ti 16GB"]}),
]
