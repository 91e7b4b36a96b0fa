# The coordinator runs llama-server: the API, the model file and the last layers (with the output layer).
# Its own GPUs are listed in inventory.py next to it (gpus = [...]).
llama_extra_args = []            # e.g. ["--metrics"]; MTP / speculative decoding measured slower over RPC
