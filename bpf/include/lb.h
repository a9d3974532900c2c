/* SPDX-License-Identifier: Apache-2.0 */
/* Statewright: load-balancer map layouts (services, backends, reverse NAT,
 * session affinity, source ranges, maglev). Byte-compatible with the Cilium
 * datapath; the Python codecs in bpf/lb.py mirror every struct here. */
#ifndef STATEWRIGHT_LB_H
#define STATEWRIGHT_LB_H

#include "common.h"

/* Default sizes; every LB map may be resized by configuration. */
#define SW_LB_MAP_MAX_ENTRIES 65536
#define SW_LB_MAGLEV_TABLE_SIZE 16381 /* must be prime */

/* Backend states carried in lb{4,6}_backend.flags. */
#define SW_BE_STATE_ACTIVE 0
#define SW_BE_STATE_TERMINATING 1
#define SW_BE_STATE_QUARANTINED 2
#define SW_BE_STATE_MAINTENANCE 3

/* Service lookup key; backend_slot 0 addresses the service frontend entry and
 * 1..count address its backend slots. */
struct lb4_key {
	__be32 address;     /* virtual IP */
	__be16 dport;       /* 0 = any port */
	__u16 backend_slot; /* host order */
	__u8 proto;         /* 0 = any protocol */
	__u8 scope;         /* external (0) or internal (1) traffic policy scope */
	__u8 pad[2];
};

struct lb6_key {
	union sw_v6addr address;
	__be16 dport;
	__u16 backend_slot;
	__u8 proto;
	__u8 scope;
	__u8 pad[2];
};

/* Service entry. The first word means the backend id for a backend slot, the
 * affinity timeout (seconds, with the algorithm in the upper bits) for a
 * frontend, or the L7 proxy port when the L7 load-balancer flag is set. */
struct lb4_service {
	union {
		__u32 backend_id;
		__u32 affinity_timeout;
		__u32 l7_lb_proxy_port;
	};
	__u16 count;          /* number of backend slots (frontend only) */
	__be16 rev_nat_index; /* key into lb{4,6}_reverse_nat */
	__u8 flags;
	__u8 flags2;
	__u16 qcount;         /* quarantined backend slots */
};

/* The v6 service value has the same shape as the v4 one. */
struct lb6_service {
	union {
		__u32 backend_id;
		__u32 affinity_timeout;
		__u32 l7_lb_proxy_port;
	};
	__u16 count;
	__be16 rev_nat_index;
	__u8 flags;
	__u8 flags2;
	__u16 qcount;
};

/* Backend value, keyed by a host-order __u32 backend id. */
struct lb4_backend {
	__be32 address;
	__be16 port;
	__u8 proto;
	__u8 flags;      /* SW_BE_STATE_* */
	__u16 cluster_id;
	__u8 zone;
	__u8 pad;
};

struct lb6_backend {
	union sw_v6addr address;
	__be16 port;
	__u8 proto;
	__u8 flags;
	__u16 cluster_id;
	__u8 zone;
	__u8 pad;
};

/* Reverse NAT value, keyed by a network-order __be16 rev-NAT id. */
struct lb4_reverse_nat {
	__be32 address;
	__be16 port;
} __attribute__((packed));

struct lb6_reverse_nat {
	union sw_v6addr address;
	__be16 port;
} __attribute__((packed));

/* Session affinity: which backend a service (rev-NAT id) currently pins. The
 * value is a single unused byte. */
struct lb_affinity_match {
	__u32 backend_id;
	__be16 rev_nat_id;
	__u16 pad;
} __attribute__((packed));

/* Scale to zero (Cilium's struct scale_to_zero_key/value): the services-map ids
 * (rev-NAT index, network order) of the frontends whose service opted in with
 * the service.cilium.io/scale-to-zero annotation. The value is the time the
 * datapath last signalled demand; the agent creates entries with 0 and never
 * overwrites an existing one. */
struct scale_to_zero_key {
	__be16 svc_id;
	__u16 pad;
} __attribute__((packed));

struct scale_to_zero_value {
	__u64 last_emit_ns;
};

/* Affinity LRU key: client address (or socket cookie) per service. Bit 0 of
 * netns_cookie says whether client_id holds a network-namespace cookie. */
struct lb4_affinity_key {
	union {
		__u32 client_ip;
		__u64 client_cookie;
	} client_id;
	__u16 rev_nat_id;
	__u8 netns_cookie;
	__u8 pad1;
	__u32 pad2;
} __attribute__((packed));

struct lb6_affinity_key {
	union {
		union sw_v6addr client_ip;
		__u64 client_cookie;
	} client_id;
	__u16 rev_nat_id;
	__u8 netns_cookie;
	__u8 pad1;
	__u32 pad2;
} __attribute__((packed));

struct lb_affinity_val {
	__u64 last_used; /* monotonic seconds */
	__u32 backend_id;
	__u32 pad;
} __attribute__((packed));

/* Source-range LPM key; prefixlen counts bits after itself, so it is
 * 32 (rev_nat_id + pad) plus the CIDR prefix length. Value: one byte. */
struct lb4_src_range_key {
	__u32 prefixlen;
	__be16 rev_nat_id;
	__u16 pad;
	__be32 addr;
};

struct lb6_src_range_key {
	__u32 prefixlen;
	__be16 rev_nat_id;
	__u16 pad;
	union sw_v6addr addr;
};

/* Maglev: the outer hash-of-maps is keyed by a __be16 rev-NAT id; each inner
 * map is an array with one entry whose value is the lookup table itself,
 * __u32 backend_ids[SW_LB_MAGLEV_TABLE_SIZE] (see sw_lb_maglev_inner below). */

#ifdef SW_DEFINE_MAPS
/* Map definitions (BTF style); compiled only where SW_DEFINE_MAPS is set, e.g.
 * bpf/maps.c, whose BTF the tests compare with the Python map specs. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#define SW_HASH_MAP(NAME, KEY, VALUE, MAX) \
	struct { \
		__uint(type, BPF_MAP_TYPE_HASH); \
		__type(key, KEY); \
		__type(value, VALUE); \
		__uint(max_entries, MAX); \
		__uint(map_flags, SW_CONDITIONAL_PREALLOC); \
	} NAME SEC(".maps")

SW_HASH_MAP(lb4_services, struct lb4_key, struct lb4_service, SW_LB_MAP_MAX_ENTRIES);
SW_HASH_MAP(lb6_services, struct lb6_key, struct lb6_service, SW_LB_MAP_MAX_ENTRIES);
SW_HASH_MAP(lb4_backends, __u32, struct lb4_backend, SW_LB_MAP_MAX_ENTRIES);
SW_HASH_MAP(lb6_backends, __u32, struct lb6_backend, SW_LB_MAP_MAX_ENTRIES);
SW_HASH_MAP(lb4_reverse_nat, __be16, struct lb4_reverse_nat, SW_LB_MAP_MAX_ENTRIES);
SW_HASH_MAP(lb6_reverse_nat, __be16, struct lb6_reverse_nat, SW_LB_MAP_MAX_ENTRIES);
SW_HASH_MAP(lb_affinity_match, struct lb_affinity_match, __u8, SW_LB_MAP_MAX_ENTRIES);

/* Created by the agent only with --enable-scale-to-zero; only the agent adds
 * entries, so it never allocates in BPF context (no preallocation, as Cilium). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct scale_to_zero_key);
	__type(value, struct scale_to_zero_value);
	__uint(max_entries, SW_LB_MAP_MAX_ENTRIES);
	__uint(map_flags, SW_F_NO_PREALLOC);
} lb_scale_to_zero SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb4_affinity_key);
	__type(value, struct lb_affinity_val);
	__uint(max_entries, SW_LB_MAP_MAX_ENTRIES);
	__uint(map_flags, 0);
} lb4_affinity SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb6_affinity_key);
	__type(value, struct lb_affinity_val);
	__uint(max_entries, SW_LB_MAP_MAX_ENTRIES);
	__uint(map_flags, 0);
} lb6_affinity SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct lb4_src_range_key);
	__type(value, __u8);
	__uint(max_entries, SW_LB_MAP_MAX_ENTRIES);
	__uint(map_flags, SW_F_NO_PREALLOC);
} lb4_source_range SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct lb6_src_range_key);
	__type(value, __u8);
	__uint(max_entries, SW_LB_MAP_MAX_ENTRIES);
	__uint(map_flags, SW_F_NO_PREALLOC);
} lb6_source_range SEC(".maps");

/* Inner maglev map: one array slot holding the whole lookup table. */
struct sw_lb_maglev_inner {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32[SW_LB_MAGLEV_TABLE_SIZE]);
	__uint(max_entries, 1);
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__uint(key_size, sizeof(__be16));
	__uint(value_size, sizeof(__u32));
	__uint(max_entries, SW_LB_MAP_MAX_ENTRIES);
	__uint(map_flags, SW_CONDITIONAL_PREALLOC);
	__array(values, struct sw_lb_maglev_inner);
} lb4_maglev SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__uint(key_size, sizeof(__be16));
	__uint(value_size, sizeof(__u32));
	__uint(max_entries, SW_LB_MAP_MAX_ENTRIES);
	__uint(map_flags, SW_CONDITIONAL_PREALLOC);
	__array(values, struct sw_lb_maglev_inner);
} lb6_maglev SEC(".maps");
#endif /* SW_DEFINE_MAPS */

#endif /* STATEWRIGHT_LB_H */
