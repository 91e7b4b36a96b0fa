# Your machines. Replace the example addresses (RFC 5737, they reach nothing) with yours,
# list each host's GPUs, and run:  pyinfra inventory.py deploy.py
# A host with an AMD or Intel card runs the Vulkan build:  {**SSH, "image_backend": "vulkan", "gpus": ["RX 7900 XTX"]}
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
