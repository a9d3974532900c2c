/* SPDX-License-Identifier: Apache-2.0 */
/* Statewright: the endpoints (lxc) map layout, byte-compatible with the Cilium
 * datapath; bpf/endpoints.py mirrors it. */
#ifndef STATEWRIGHT_ENDPOINTS_H
#define STATEWRIGHT_ENDPOINTS_H

#include "common.h"

#define SW_ENDPOINTS_MAP_MAX_ENTRIES 65535

/* endpoint_info.flags bits. */
#define SW_ENDPOINT_F_HOST 1       /* the local host itself */
#define SW_ENDPOINT_F_ATHOSTNS 2   /* lives in the host network namespace */

/* Key: an IPv4 address occupies the first four bytes of ip, the rest zero. */
struct endpoint_key {
	union {
		struct {
			__u32 ip4;
			__u32 pad1;
			__u32 pad2;
			__u32 pad3;
		};
		union sw_v6addr ip6;
	};
	__u8 family; /* SW_FAMILY_IPV4 or SW_FAMILY_IPV6 */
	__u8 key;
	__u16 cluster_id;
} __attribute__((packed));

struct endpoint_info {
	__u32 ifindex;
	__u16 unused;
	__u16 lxc_id;
	__u32 flags;     /* SW_ENDPOINT_F_* */
	__u32 pad0;      /* keeps mac 8-byte aligned */
	__u64 mac;
	__u64 node_mac;
	__u32 sec_id;
	__u32 parent_ifindex;
	__u32 pad[2];
};

#ifdef SW_DEFINE_MAPS
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct endpoint_key);
	__type(value, struct endpoint_info);
	__uint(max_entries, SW_ENDPOINTS_MAP_MAX_ENTRIES);
	__uint(map_flags, SW_CONDITIONAL_PREALLOC);
} endpoints SEC(".maps");
#endif /* SW_DEFINE_MAPS */

#endif /* STATEWRIGHT_ENDPOINTS_H */
