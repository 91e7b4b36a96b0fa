# Settings for every host. This file holds what people change for their hardware;
# every other setting keeps the default listed in README.md ("Settings"), which
# comes from llama_rpc_deploy/settings.py. A host's own values go next to it in
# inventory.py; group_data/coordinator.py and group_data/workers.py hold per-role ones.

# --- the model ---
# A GGUF file on the coordinator, e.g. in LM Studio's models folder. Its folder is mounted read-only.
llama_model_path = "/CHANGE_ME/models/gemma-4-31B-it-qat-UD-Q4_K_XL.gguf"

# --- serving ---
llama_ctx_size = 65536           # tokens, shared by the parallel slots
llama_parallel = 4               # parallel request slots
llama_cache_type_k = "f16"       # f16 measured faster than q8_0 over RPC (seed article)
llama_cache_type_v = "f16"
llama_flash_attn = "auto"
llama_tensor_split = None        # None: by free memory; else one share per device, workers' first
llama_sleep_idle_seconds = None  # e.g. 900: unload the model when idle, reload on the next request
llama_port = 8080
rpc_port = 50052

# --- the image ---
# The llama.cpp commit to build (the one the llama-cpp-python 0.3.36 sdist vendors).
llama_cpp_ref = "0c1e57098"
image_backend = "cuda"           # "cpu" for hosts without an NVIDIA GPU
