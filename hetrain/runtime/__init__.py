"""The runtime: real training on torch.distributed (gloo on CPU, NCCL on GPU)."""
