"""The backend fixtures of the map tests (memory everywhere, kernel where it works)."""

from tests.bpf.conftest import backend_kind, kernel_pin_dir, memory_pin_dir, opener, pin_dir

__all__ = ["backend_kind", "kernel_pin_dir", "memory_pin_dir", "opener", "pin_dir"]
