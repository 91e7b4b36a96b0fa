# Workers run rpc-server 24/7 and serve their GPUs to the coordinator.
rpc_cache = True                 # keep tensors on disk (rpc_cache_dir): faster model reloads
rpc_extra_args = []
