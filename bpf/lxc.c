// SPDX-License-Identifier: Apache-2.0
/* Statewright: the per-endpoint tc programs, on the host side of each pod's
 * veth (docs/datapath.md).
 *
 * sw_lxc_to   (veth egress: packets on their way into the pod)
 * sw_lxc_from (veth ingress: packets the pod sent)
 *
 * The endpoint is found by the pod's address in the endpoints (lxc) map: the
 * destination of a packet to the pod, the source of one from it. Addresses
 * that are no endpoint's pass untouched, and so does what is not IPv4 or IPv6
 * (ARP), IPv6 neighbour discovery and ICMP errors.
 *
 * Connection tracking (include/ct.h): a flow's entry is keyed by its first
 * packet's addresses and ports and by its direction seen from the endpoint.
 * A packet that belongs to a live entry (either direction) passes without a
 * policy lookup and renews the entry. A new flow towards the pod is checked
 * against the endpoint's ingress policy when the endpoint enforces ingress
 * (policy_endpoints): the source's identity from the ipcache (longest
 * prefix; world when absent), then Cilium's two lookups in
 * policy_maps[endpoint id] (the identity, then any identity), a deny entry
 * winning, exactly as the socket program checks egress. Traffic from the
 * host (identity 1) is allowed, as Cilium's allow-localhost default does. A
 * new flow from the pod is checked against its egress policy only for
 * protocols the socket program cannot see (anything but TCP, UDP and SCTP,
 * e.g. ICMP). Allowed new flows get an entry; refused packets are dropped
 * and counted in `metrics` by reason and direction.
 */
#define SW_DEFINE_MAPS
#include <stdbool.h>
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "include/endpoints.h"
#include "include/ipcache.h"
#include "include/policy.h"
#include "include/ct.h"
#include "include/flow.h"
#include "include/events.h"

#define SW_IDENTITY_HOST 1

/* ------------------------------------------------------------ lookups */

static __always_inline struct endpoint_info *sw_endpoint(const struct sw_flow *f,
							 const union sw_v6addr *addr)
{
	struct endpoint_key key = {};

	if (f->family == 4) {
		__builtin_memcpy(&key.ip4, addr, 4);
		key.family = SW_FAMILY_IPV4;
	} else {
		key.ip6 = *addr;
		key.family = SW_FAMILY_IPV6;
	}
	return bpf_map_lookup_elem(&endpoints, &key);
}

static __always_inline __u32 sw_identity(const struct sw_flow *f, const union sw_v6addr *addr)
{
	return sw_ipcache_identity(f->family, addr);
}

static __always_inline __u8 sw_enforced(__u32 ep)
{
	struct policy_netns *pe = bpf_map_lookup_elem(&policy_endpoints, &ep);

	return pe ? pe->flags : 0;
}

/* 0 when endpoint `ep`'s policy allows `remote` in the direction on
 * proto/dport, else the drop reason: Cilium's lookups, the identity's entry
 * first, then any identity's; a deny in either wins, no entry denies. `*lpm`
 * is the deciding entry's lpm_prefix_length (SW_EVENT_NO_LPM: none). */
static __always_inline int sw_policy(__u32 ep, __u32 remote, __u8 egress, __u8 proto,
				     __be16 dport, __u8 *lpm)
{
	struct policy_key key = {
		.prefixlen = SW_POLICY_FULL_PREFIX,
		.sec_label = remote,
		.egress = egress,
		.protocol = proto,
		.dport = dport,
	};
	struct policy_entry *l3, *l4;
	void *map;

	*lpm = SW_EVENT_NO_LPM;
	map = bpf_map_lookup_elem(&policy_maps, &ep);
	if (!map)
		return SW_DROP_POLICY;
	l3 = bpf_map_lookup_elem(map, &key);
	if (l3 && (l3->flags & SW_POLICY_F_DENY)) {
		*lpm = l3->flags >> SW_POLICY_LPM_SHIFT;
		return SW_DROP_POLICY_DENY;
	}
	key.sec_label = 0;
	l4 = bpf_map_lookup_elem(map, &key);
	if (l4) {
		*lpm = l4->flags >> SW_POLICY_LPM_SHIFT;
		return (l4->flags & SW_POLICY_F_DENY) ? SW_DROP_POLICY_DENY : 0;
	}
	if (l3)
		*lpm = l3->flags >> SW_POLICY_LPM_SHIFT;
	return l3 ? 0 : SW_DROP_POLICY;
}

/* ------------------------------------------------------------ events */

/* An event of `type` for flow `f` (include/events.h; emitted only when the
 * agent enabled events, within the rate limit). */
static __always_inline void sw_lxc_event(const struct sw_flow *f, __u8 type, int reason,
					 __u8 dir, __u32 ep_id, __u32 src, __u32 dst, __u8 lpm)
{
	struct sw_event ev = {};

	ev.type = type;
	ev.verdict = reason ? SW_EVENT_VERDICT_DROPPED : SW_EVENT_VERDICT_FORWARDED;
	ev.reason = (__u8)reason;
	ev.dir = dir;
	ev.family = f->family;
	ev.proto = f->proto;
	ev.lpm = lpm;
	ev.source = SW_EVENT_SRC_LXC;
	ev.src_identity = src;
	ev.dst_identity = dst;
	ev.endpoint_id = (__u16)ep_id;
	ev.sport = f->sport;
	ev.dport = f->dport;
	__builtin_memcpy(ev.saddr, &f->saddr, 16);
	__builtin_memcpy(ev.daddr, &f->daddr, 16);
	sw_event_emit(&ev);
}

/* Count and report a drop, then drop. */
static __always_inline int sw_lxc_drop(const struct sw_flow *f, int reason, __u8 dir,
				       __u32 ep_id, __u32 src, __u32 dst, __u8 lpm)
{
	sw_lxc_event(f, SW_EVENT_DROP, reason, dir, ep_id, src, dst, lpm);
	return sw_drop(f, reason, dir);
}

/* ------------------------------------------------------------ verdicts */

static __always_inline bool sw_socket_proto(__u8 proto)
{
	return proto == SW_IPPROTO_TCP || proto == SW_IPPROTO_UDP || proto == SW_IPPROTO_SCTP;
}

/* The port of a policy lookup: the destination port where the protocol has
 * ports, else 0 (an ICMP flow's "ports" are its echo identifier). */
static __always_inline __be16 sw_policy_port(const struct sw_flow *f)
{
	return sw_socket_proto(f->proto) ? f->dport : 0;
}

SEC("tc")
int sw_lxc_to(struct __sk_buff *skb)
{
	struct sw_flow f = {};
	struct endpoint_info *ep;
	union sw_ct_key k;
	__u32 now, src, ep_id;
	int ret;

	__u8 lpm = SW_EVENT_NO_LPM;

	ret = sw_parse(skb, &f);
	if (ret == SW_UNTRACKED)
		return TC_ACT_OK;
	if (ret)
		return sw_lxc_drop(&f, ret, SW_METRIC_INGRESS, 0, 0, 0, lpm);
	ep = sw_endpoint(&f, &f.daddr);
	if (!ep)
		return TC_ACT_OK;
	ep_id = ep->lxc_id;
	now = sw_now();
	if (sw_ct_known(&f, SW_CT_F_INGRESS, SW_CT_F_EGRESS, now))
		return TC_ACT_OK;
	src = sw_identity(&f, &f.saddr);
	if (src != SW_IDENTITY_HOST && (sw_enforced(ep_id) & SW_POLICY_NETNS_F_INGRESS)) {
		ret = sw_policy(ep_id, src, 0, f.proto, sw_policy_port(&f), &lpm);
		if (ret)
			return sw_lxc_drop(&f, ret, SW_METRIC_INGRESS, ep_id, src, ep->sec_id, lpm);
		sw_lxc_event(&f, SW_EVENT_POLICY, 0, SW_METRIC_INGRESS, ep_id, src, ep->sec_id,
			     lpm);
	}
	sw_ct_key(&k, &f, false, SW_CT_F_INGRESS);
	ret = sw_ct_create(&f, &k, src, skb->ifindex, now);
	if (ret)
		return sw_lxc_drop(&f, ret, SW_METRIC_INGRESS, ep_id, src, ep->sec_id, lpm);
	return TC_ACT_OK;
}

SEC("tc")
int sw_lxc_from(struct __sk_buff *skb)
{
	struct sw_flow f = {};
	struct endpoint_info *ep;
	union sw_ct_key k;
	__u32 now, ep_id;
	int ret;

	__u8 lpm = SW_EVENT_NO_LPM;
	__u32 dst;

	ret = sw_parse(skb, &f);
	if (ret == SW_UNTRACKED)
		return TC_ACT_OK;
	if (ret)
		return sw_lxc_drop(&f, ret, SW_METRIC_EGRESS, 0, 0, 0, lpm);
	ep = sw_endpoint(&f, &f.saddr);
	if (!ep)
		return TC_ACT_OK;
	ep_id = ep->lxc_id;
	now = sw_now();
	if (sw_ct_known(&f, SW_CT_F_EGRESS, SW_CT_F_INGRESS, now))
		return TC_ACT_OK;
	if (!sw_socket_proto(f.proto) && (sw_enforced(ep_id) & SW_POLICY_NETNS_F_EGRESS)) {
		dst = sw_identity(&f, &f.daddr);
		ret = sw_policy(ep_id, dst, 1, f.proto, sw_policy_port(&f), &lpm);
		if (ret)
			return sw_lxc_drop(&f, ret, SW_METRIC_EGRESS, ep_id, ep->sec_id, dst, lpm);
		sw_lxc_event(&f, SW_EVENT_POLICY, 0, SW_METRIC_EGRESS, ep_id, ep->sec_id, dst, lpm);
	}
	sw_ct_key(&k, &f, false, SW_CT_F_EGRESS);
	ret = sw_ct_create(&f, &k, ep->sec_id, skb->ifindex, now);
	if (ret)
		return sw_lxc_drop(&f, ret, SW_METRIC_EGRESS, ep_id, ep->sec_id, 0, lpm);
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
