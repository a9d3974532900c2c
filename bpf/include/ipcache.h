/* SPDX-License-Identifier: Apache-2.0 */
/* Statewright: the ipcache LPM map layout (IP prefix -> security identity and
 * tunnel endpoint), byte-compatible with the Cilium datapath; bpf/ipcache.py
 * mirrors it. */
#ifndef STATEWRIGHT_IPCACHE_H
#define STATEWRIGHT_IPCACHE_H

#include "common.h"

#define SW_IPCACHE_MAP_MAX_ENTRIES 512000

/* prefixlen counts the bits after itself: 32 (cluster_id, pad1, family) plus
 * the address prefix length. */
struct ipcache_key {
	__u32 prefixlen;
	__u16 cluster_id;
	__u8 pad1;
	__u8 family; /* SW_FAMILY_IPV4 or SW_FAMILY_IPV6 */
	union {
		struct {
			__u32 ip4;
			__u32 pad4;
			__u32 pad5;
			__u32 pad6;
		};
		union sw_v6addr ip6;
	};
} __attribute__((packed));

/* flags bits: 1 skip tunnel, 2 has tunnel endpoint, 4 IPv6 tunnel endpoint. */
struct remote_endpoint_info {
	__u32 sec_identity;
	union {
		struct {
			__u32 ip4;
			__u32 pad1;
			__u32 pad2;
			__u32 pad3;
		};
		union sw_v6addr ip6;
	} tunnel_endpoint;
	__u16 pad;
	__u8 key;   /* encryption key index */
	__u8 flags;
};

#ifdef SW_DEFINE_MAPS
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct ipcache_key);
	__type(value, struct remote_endpoint_info);
	__uint(max_entries, SW_IPCACHE_MAP_MAX_ENTRIES);
	__uint(map_flags, SW_F_NO_PREALLOC);
} ipcache SEC(".maps");

#ifndef SW_IDENTITY_WORLD
#define SW_IDENTITY_WORLD 2
#endif

/* The security identity of `addr` (family 4: its first four bytes) from its
 * /32 or /128 entry; the world's when there is none. */
static __always_inline __u32 sw_ipcache_identity(__u8 family, const union sw_v6addr *addr)
{
	struct ipcache_key key = {};
	struct remote_endpoint_info *info;

	if (family == 4) {
		key.prefixlen = 32 + 32;
		key.family = SW_FAMILY_IPV4;
		__builtin_memcpy(&key.ip4, addr, 4);
	} else {
		key.prefixlen = 32 + 128;
		key.family = SW_FAMILY_IPV6;
		key.ip6 = *addr;
	}
	info = bpf_map_lookup_elem(&ipcache, &key);
	return info ? info->sec_identity : SW_IDENTITY_WORLD;
}
#endif /* SW_DEFINE_MAPS */

#endif /* STATEWRIGHT_IPCACHE_H */
