"""bpfops: reconciler Operations that turn table rows into BPF map entries."""
