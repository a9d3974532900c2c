/* SPDX-License-Identifier: Apache-2.0 */
/* Statewright: connection tracking for the per-endpoint tc programs
 * (bpf/lxc.c), with the Cilium datapath's tuple and entry layouts
 * (ipv4_ct_tuple, ipv6_ct_tuple, ct_entry of Cilium 1.16+); bpf/ct.py mirrors
 * it. Also the drop counters (Cilium's metrics_key/metrics_value) and the
 * ingress enforcement of each endpoint (policy_endpoints).
 *
 * One LRU hash per family holds every protocol (Cilium splits TCP and the
 * rest into two maps). A flow has one entry, keyed by its original
 * direction: daddr/saddr/dport/sport as the first packet carried them,
 * nexthdr the L4 protocol and flags SW_CT_F_EGRESS for a flow the endpoint
 * opened, SW_CT_F_INGRESS for one opened towards it. A reply is found by
 * swapping addresses and ports. ICMP echo flows use the identifier as both
 * ports. The agent removes expired entries (lifetime in seconds of
 * CLOCK_MONOTONIC, bpf_ktime_get_ns() / 1e9) and LRU eviction the oldest
 * when the map is full. */
#ifndef STATEWRIGHT_CT_H
#define STATEWRIGHT_CT_H

#include "common.h"
#include "policy.h"

#define SW_CT_MAP_MAX_ENTRIES 65536
#define SW_METRICS_MAX_ENTRIES 1024
#define SW_POLICY_EP_MAX_ENTRIES 4096

/* ipv{4,6}_ct_tuple.flags: the flow's direction seen from the endpoint
 * (Cilium's TUPLE_F_OUT / TUPLE_F_IN). */
#define SW_CT_F_EGRESS 0
#define SW_CT_F_INGRESS 1
/* A client's flow to a service frontend, seen on the node's device (Cilium's
 * TUPLE_F_SERVICE): the entry holds the chosen backend and the rev-NAT id. */
#define SW_CT_F_SERVICE 4

/* ct_entry.flags bits, in Cilium's bit-field order. */
#define SW_CT_RX_CLOSING (1 << 0)
#define SW_CT_TX_CLOSING (1 << 1)
#define SW_CT_SEEN_NON_SYN (1 << 4)
#define SW_CT_NODE_PORT (1 << 5)

/* Lifetimes in seconds: Cilium's defaults. */
#define SW_CT_LIFETIME_TCP 21600
#define SW_CT_LIFETIME_NONTCP 60
#define SW_CT_SYN_TIMEOUT 60
#define SW_CT_CLOSE_TIMEOUT 10

/* Drop reasons: Cilium's codes (metrics_key.reason, positive). */
#define SW_DROP_POLICY 133
#define SW_DROP_INVALID 134
#define SW_DROP_CT_INVALID_HDR 135
#define SW_DROP_WRITE_ERROR 141
#define SW_DROP_CSUM_L3 153
#define SW_DROP_CSUM_L4 154
#define SW_DROP_CT_CREATE_FAILED 155
#define SW_DROP_NO_SERVICE 158
#define SW_DROP_NAT_NO_MAPPING 167
#define SW_DROP_NOT_IN_SRC_RANGE 177
#define SW_DROP_POLICY_DENY 181

/* metrics_key.dir: 1 ingress (to the endpoint), 2 egress (from it). */
#define SW_METRIC_INGRESS 1
#define SW_METRIC_EGRESS 2

struct ipv4_ct_tuple {
	__be32 daddr;
	__be32 saddr;
	__be16 dport;
	__be16 sport;
	__u8 nexthdr;
	__u8 flags;   /* SW_CT_F_* */
} __attribute__((packed));

struct ipv6_ct_tuple {
	union sw_v6addr daddr;
	union sw_v6addr saddr;
	__be16 dport;
	__be16 sport;
	__u8 nexthdr;
	__u8 flags;
} __attribute__((packed));

/* Cilium's ct_entry. `flags` is its 16-bit bit field (rx_closing:1,
 * tx_closing:1, reserved1:1, lb_loopback:1, seen_non_syn:1, node_port:1, ...)
 * as one integer. packets/bytes count both directions; src_sec_id is the
 * identity of the flow's source when it was created. */
struct ct_entry {
	__u64 reserved0;
	__u64 backend_id;
	__u64 packets;
	__u64 bytes;
	__u32 lifetime;
	__u16 flags;
	__u16 rev_nat_index;
	__u16 ifindex;
	__u8 tx_flags_seen;
	__u8 rx_flags_seen;
	__u32 src_sec_id;
	__u32 last_tx_report;
	__u32 last_rx_report;
};

/* Cilium's metrics_key: dir is its dir:2/pad:6 byte. */
struct metrics_key {
	__u8 reason;
	__u8 dir;
	__u16 line;
	__u8 file;
	__u8 reserved[3];
};

struct metrics_value {
	__u64 count;
	__u64 bytes;
};

#ifdef SW_DEFINE_MAPS
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ipv4_ct_tuple);
	__type(value, struct ct_entry);
	__uint(max_entries, SW_CT_MAP_MAX_ENTRIES);
} ct4_global SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ipv6_ct_tuple);
	__type(value, struct ct_entry);
	__uint(max_entries, SW_CT_MAP_MAX_ENTRIES);
} ct6_global SEC(".maps");

/* Drop counters by reason and direction (a plain hash updated atomically). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct metrics_key);
	__type(value, struct metrics_value);
	__uint(max_entries, SW_METRICS_MAX_ENTRIES);
	__uint(map_flags, SW_F_NO_PREALLOC);
} metrics SEC(".maps");

/* Endpoint id -> its enforced directions (struct policy_netns of policy.h),
 * for the tc programs, which see packets and not namespaces. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct policy_netns);
	__uint(max_entries, SW_POLICY_EP_MAX_ENTRIES);
	__uint(map_flags, SW_F_NO_PREALLOC);
} policy_endpoints SEC(".maps");
#endif /* SW_DEFINE_MAPS */

#endif /* STATEWRIGHT_CT_H */
