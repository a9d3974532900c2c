/* SPDX-License-Identifier: Apache-2.0 */
/* Statewright: the per-endpoint policy map layout, byte-compatible with the
 * Cilium datapath's cilium_policy_v2 (bpf/lib/policy.h), and the two maps that
 * let the socket program find an endpoint's policy; bpf/policy.py mirrors it.
 *
 * Per-endpoint maps: one LPM trie per endpoint, pinned as
 * cilium_policy_v2_<endpoint id, 5 digits> under the agent's pin directory,
 * written by bpfops/policy_ops.py.
 *
 * policy_maps: a hash of maps, endpoint id -> that endpoint's policy map. A
 * cgroup socket program is one program for every pod of the cgroup, so it
 * cannot be compiled per endpoint as Cilium's tc programs are (each of those
 * names its own cilium_policy_v2_<id>); the outer map gives it each
 * endpoint's own map while the maps stay per endpoint, as Cilium has them.
 *
 * policy_netns: network-namespace cookie of a pod -> its endpoint id and
 * which directions its policy enforces. The socket program identifies the
 * connecting endpoint by bpf_get_netns_cookie(). */
#ifndef STATEWRIGHT_POLICY_H
#define STATEWRIGHT_POLICY_H

#include "common.h"

#define SW_POLICY_MAP_MAX_ENTRIES 16384  /* Cilium's default policy map size */
#define SW_POLICY_ENDPOINTS_MAX_ENTRIES 4096  /* endpoint ids 1..4095 */

/* Bits of the key after prefixlen: sec_label (32), egress/pad (8), protocol
 * (8), dport (16). An entry's prefixlen is SW_POLICY_STATIC_PREFIX plus its
 * lpm_prefix_length (0: any protocol, 8: protocol with any port, 8 + port
 * prefix bits). */
#define SW_POLICY_FULL_PREFIX 64
#define SW_POLICY_STATIC_PREFIX 40
#define SW_POLICY_PROTO_PREFIX_BITS 8
#define SW_POLICY_FULL_PREFIX_BITS 24

/* policy_entry.flags bits: deny:1, reserved:2, lpm_prefix_length:5. */
#define SW_POLICY_F_DENY 1
#define SW_POLICY_LPM_SHIFT 3

/* policy_netns.flags bits. */
#define SW_POLICY_NETNS_F_EGRESS 1
#define SW_POLICY_NETNS_F_INGRESS 2

/* Cilium's struct policy_key. The egress:1/pad:7 bit field is one byte whose
 * lowest bit is the direction (little-endian bit-field order). */
struct policy_key {
	__u32 prefixlen; /* struct bpf_lpm_trie_key's prefixlen */
	__u32 sec_label;
	__u8 egress;     /* bit 0: egress; bits 1-7: pad */
	__u8 protocol;
	__be16 dport;
} __attribute__((packed));

/* Cilium's struct policy_entry (1.17 and later). */
struct policy_entry {
	__be16 proxy_port;
	__u8 flags;      /* deny:1, reserved:2, lpm_prefix_length:5 */
	__u8 auth_type;  /* auth_type:7, has_explicit_auth_type:1 */
	__u8 proxy_port_priority;
	__u8 pad1;
	__u16 pad2;
	__u32 cookie;
};

struct policy_netns {
	__u32 endpoint_id;
	__u8 flags;      /* SW_POLICY_NETNS_F_* */
	__u8 pad[3];
};

#ifdef SW_DEFINE_MAPS
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

/* The per-endpoint map as the inner map of policy_maps (sizes only: its BTF
 * types are those of cilium_policy_v2 below). */
struct sw_policy_inner {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(key_size, sizeof(struct policy_key));
	__uint(value_size, sizeof(struct policy_entry));
	__uint(max_entries, SW_POLICY_MAP_MAX_ENTRIES);
	__uint(map_flags, SW_F_NO_PREALLOC);
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
	__uint(max_entries, SW_POLICY_ENDPOINTS_MAX_ENTRIES);
	__uint(map_flags, SW_F_NO_PREALLOC);
	__array(values, struct sw_policy_inner);
} policy_maps SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u64);
	__type(value, struct policy_netns);
	__uint(max_entries, SW_POLICY_ENDPOINTS_MAX_ENTRIES);
	__uint(map_flags, SW_F_NO_PREALLOC);
} policy_netns SEC(".maps");

#ifdef SW_DEFINE_POLICY_TEMPLATE
/* The layout of every cilium_policy_v2_<id> map (declared for BTF only). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct policy_key);
	__type(value, struct policy_entry);
	__uint(max_entries, SW_POLICY_MAP_MAX_ENTRIES);
	__uint(map_flags, SW_F_NO_PREALLOC);
} cilium_policy_v2 SEC(".maps");
#endif
#endif /* SW_DEFINE_MAPS */

#endif /* STATEWRIGHT_POLICY_H */
