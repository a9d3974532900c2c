"""A small reader for ``bpftool btf dump -j`` output: struct member offsets and map definitions."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Member:
    """A flattened struct member: offset and size in bytes, and its C type name."""

    name: str
    offset: int
    size: int
    type_name: str


class BTF:
    """Types of one object file, by id."""

    def __init__(self, types: list[dict[str, Any]]) -> None:
        self.types = {t["id"]: t for t in types}

    @classmethod
    def from_object(cls, bpftool: str, path: str) -> BTF:
        """Read the BTF of a compiled BPF object with bpftool."""
        out = subprocess.run(
            [bpftool, "-j", "btf", "dump", "file", path], check=True, capture_output=True
        ).stdout
        return cls(json.loads(out)["types"])

    def resolve(self, type_id: int) -> dict[str, Any]:
        """Follow typedefs and qualifiers."""
        t = self.types[type_id]
        while t["kind"] in ("TYPEDEF", "VOLATILE", "CONST", "RESTRICT", "TYPE_TAG"):
            t = self.types[t["type_id"]]
        return t

    def type_name(self, type_id: int) -> str:
        """The outermost name of a type (typedef name such as __be16, or struct name)."""
        t = self.types[type_id]
        if t["kind"] == "ARRAY":
            return f"{self.type_name(t['type_id'])}[{t['nr_elems']}]"
        return str(t.get("name", "(anon)"))

    def size(self, type_id: int) -> int:
        """Size in bytes of a type."""
        t = self.resolve(type_id)
        if t["kind"] == "ARRAY":
            return int(t["nr_elems"]) * self.size(t["type_id"])
        if t["kind"] == "PTR":
            return 8
        return int(t["size"])

    def struct(self, name: str) -> dict[str, Any]:
        """The named struct (or union)."""
        for t in self.types.values():
            if t["kind"] in ("STRUCT", "UNION") and t["name"] == name:
                return t
        raise KeyError(name)

    def members(self, struct: dict[str, Any], base: int = 0) -> list[Member]:
        """Members with anonymous structs/unions flattened into their parent."""
        out: list[Member] = []
        for m in struct["members"]:
            offset_bits = base + int(m["bits_offset"])
            assert offset_bits % 8 == 0, f"bitfield {m['name']} not supported"
            inner = self.resolve(m["type_id"])
            if m["name"] == "(anon)" and inner["kind"] in ("STRUCT", "UNION"):
                out.extend(self.members(inner, offset_bits))
            else:
                out.append(
                    Member(
                        m["name"],
                        offset_bits // 8,
                        self.size(m["type_id"]),
                        self.type_name(m["type_id"]),
                    )
                )
        return out

    def top_level_groups(self, struct: dict[str, Any]) -> list[list[Member]]:
        """Each top-level member as the list of names that can stand for it (union alternatives)."""
        groups = []
        for m in struct["members"]:
            inner = self.resolve(m["type_id"])
            if m["name"] == "(anon)" and inner["kind"] in ("STRUCT", "UNION"):
                groups.append(self.members(inner, int(m["bits_offset"])))
            else:
                groups.append(self.members({"members": [m]}))
        return groups

    def maps(self) -> dict[str, dict[str, Any]]:
        """Map definitions in .maps: name -> {type, key, value, key_size, value_size, ...}."""
        out = {}
        for t in self.types.values():
            if t["kind"] != "VAR":
                continue
            definition = self.resolve(t["type_id"])
            if definition["kind"] != "STRUCT":
                continue
            out[t["name"]] = self.map_def(definition)
        return out

    def map_def(self, definition: dict[str, Any]) -> dict[str, Any]:
        """Decode one BTF map definition struct."""
        fields: dict[str, Any] = {}
        for m in definition["members"]:
            ptr = self.types[m["type_id"]]
            name = m["name"]
            if name == "values":  # __array(values, struct inner): ARRAY of PTR to the def
                elem = self.types[ptr["type_id"]]
                fields["inner"] = self.map_def(self.resolve(elem["type_id"]))
                continue
            target = self.types[ptr["type_id"]]
            if name in ("key", "value"):
                fields[name] = ptr["type_id"]
                fields[f"{name}_size"] = self.size(ptr["type_id"])
                fields[f"{name}_name"] = self.type_name(ptr["type_id"])
            else:
                fields[name] = int(target["nr_elems"])
        return fields
