"""bpf: BPF map specs, codecs and backends (kernel maps via libbpf, and an in-memory twin)."""
