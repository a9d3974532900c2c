/* SPDX-License-Identifier: Apache-2.0 */
/* Statewright: the north-south NAT state of bpf/nodeport.c (bpf/nat.py mirrors it).
 *
 * One LRU hash per family, keyed by the CT tuple of ct.h (the packet's addresses and
 * ports as it is seen on the node's device) with `flags` saying what the entry
 * rewrites:
 *
 *   SW_NAT_F_SNAT      client -> backend on its way out to another node:
 *                      the source becomes to_addr:to_port (this node, a NAT port);
 *   SW_NAT_F_REV_SNAT  backend -> this node:NAT port, a reply arriving:
 *                      the destination becomes to_addr:to_port (the client);
 *   SW_NAT_F_REV_DNAT  backend -> client, a reply on its way out:
 *                      the source becomes to_addr:to_port (the service frontend).
 *
 * `lifetime` (seconds of CLOCK_MONOTONIC) is renewed by every packet that uses the
 * entry; the agent removes expired entries as its CT GC does, LRU eviction the
 * oldest when a map is full. nodeport_devices holds, per external device, the
 * addresses SNAT uses for packets leaving through it. */
#ifndef STATEWRIGHT_NAT_H
#define STATEWRIGHT_NAT_H

#include "common.h"
#include "ct.h"

#define SW_NAT_MAP_MAX_ENTRIES 65536
#define SW_NODEPORT_DEVICES_MAX_ENTRIES 256

#define SW_NAT_F_SNAT 0
#define SW_NAT_F_REV_SNAT 1
#define SW_NAT_F_REV_DNAT 2

/* nat{4,6}_entry.flags: on a REV_DNAT entry, the backend is on another node and the
 * client's packets to it are masqueraded (SNAT) when they leave. */
#define SW_NAT_E_NEEDS_SNAT 1

/* nodeport_device.flags: which addresses are set. */
#define SW_NODEPORT_DEV_IPV4 1
#define SW_NODEPORT_DEV_IPV6 2

struct nat4_entry {
	__be32 to_addr;
	__be16 to_port;
	__be16 rev_nat_index; /* the service of the flow (rev-NAT id) */
	__u32 lifetime;
	__u32 flags;          /* SW_NAT_E_* */
};

struct nat6_entry {
	union sw_v6addr to_addr;
	__be16 to_port;
	__be16 rev_nat_index;
	__u32 lifetime;
	__u32 flags;
};

struct nodeport_device {
	__be32 ip4;
	union sw_v6addr ip6;
	__u32 flags; /* SW_NODEPORT_DEV_* */
};

#ifdef SW_DEFINE_MAPS
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ipv4_ct_tuple);
	__type(value, struct nat4_entry);
	__uint(max_entries, SW_NAT_MAP_MAX_ENTRIES);
} nodeport_nat4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ipv6_ct_tuple);
	__type(value, struct nat6_entry);
	__uint(max_entries, SW_NAT_MAP_MAX_ENTRIES);
} nodeport_nat6 SEC(".maps");

/* ifindex of an external device -> its SNAT addresses (written by the agent). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct nodeport_device);
	__uint(max_entries, SW_NODEPORT_DEVICES_MAX_ENTRIES);
	__uint(map_flags, SW_F_NO_PREALLOC);
} nodeport_devices SEC(".maps");
#endif /* SW_DEFINE_MAPS */

#endif /* STATEWRIGHT_NAT_H */
