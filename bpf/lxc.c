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

#define SW_IPPROTO_ICMP 1
#define SW_IPPROTO_TCP 6
#define SW_IPPROTO_UDP 17
#define SW_IPPROTO_ICMPV6 58
#define SW_IPPROTO_SCTP 132
#define SW_IDENTITY_HOST 1
#define SW_IDENTITY_WORLD 2

#define SW_TCP_FIN 0x01
#define SW_TCP_SYN 0x02
#define SW_TCP_RST 0x04
#define SW_TCP_ACK 0x10

/* parse() results besides a drop reason. */
#define SW_PARSED 0
#define SW_UNTRACKED 1

#define ETH_HLEN_ 14

/* A packet's flow, addresses as 16 bytes (IPv4 in the first four). */
struct sw_flow {
	union sw_v6addr saddr;
	union sw_v6addr daddr;
	__be16 sport;
	__be16 dport;
	__u8 family;   /* 4 or 6 */
	__u8 proto;
	__u8 tcp_flags;
	__u8 pad;
	__u32 len;
};

/* Either family's CT key. */
union sw_ct_key {
	struct ipv4_ct_tuple v4;
	struct ipv6_ct_tuple v6;
};

/* ------------------------------------------------------------ parsing */

/* The L4 ports (ICMP echo: the identifier as both) and TCP flags at `off`. */
static __always_inline int sw_parse_l4(struct __sk_buff *skb, struct sw_flow *f, __u32 off)
{
	__u8 hdr[14];

	switch (f->proto) {
	case SW_IPPROTO_TCP:
		if (bpf_skb_load_bytes(skb, off, hdr, 14) < 0)
			return SW_DROP_CT_INVALID_HDR;
		f->tcp_flags = hdr[13];
		break;
	case SW_IPPROTO_UDP:
	case SW_IPPROTO_SCTP:
		if (bpf_skb_load_bytes(skb, off, hdr, 4) < 0)
			return SW_DROP_CT_INVALID_HDR;
		break;
	case SW_IPPROTO_ICMP:
	case SW_IPPROTO_ICMPV6:
		if (bpf_skb_load_bytes(skb, off, hdr, 8) < 0)
			return SW_DROP_CT_INVALID_HDR;
		if (f->proto == SW_IPPROTO_ICMP) {
			if (hdr[0] != 0 && hdr[0] != 8)  /* not echo: errors and the rest */
				return SW_UNTRACKED;
		} else if (hdr[0] != 128 && hdr[0] != 129) {
			return SW_UNTRACKED;  /* ND, errors, MLD */
		}
		__builtin_memcpy(&f->sport, &hdr[4], 2);
		f->dport = f->sport;
		return SW_PARSED;
	default:
		return SW_PARSED;  /* tracked by addresses and protocol only */
	}
	__builtin_memcpy(&f->sport, &hdr[0], 2);
	__builtin_memcpy(&f->dport, &hdr[2], 2);
	return SW_PARSED;
}

static __always_inline int sw_parse4(struct __sk_buff *skb, struct sw_flow *f)
{
	__u8 ip[20];
	__u32 ihl;
	__be16 frag;

	if (bpf_skb_load_bytes(skb, ETH_HLEN_, ip, 20) < 0)
		return SW_DROP_INVALID;
	ihl = (ip[0] & 0x0f) * 4;
	if ((ip[0] >> 4) != 4 || ihl < 20)
		return SW_DROP_INVALID;
	f->family = 4;
	f->proto = ip[9];
	__builtin_memcpy(&f->saddr, &ip[12], 4);
	__builtin_memcpy(&f->daddr, &ip[16], 4);
	__builtin_memcpy(&frag, &ip[6], 2);
	if (bpf_ntohs(frag) & 0x1fff)
		return SW_PARSED;  /* a later fragment: no L4 header */
	return sw_parse_l4(skb, f, ETH_HLEN_ + ihl);
}

static __always_inline int sw_parse6(struct __sk_buff *skb, struct sw_flow *f)
{
	__u8 ip[40], ext[2];
	__u32 off = ETH_HLEN_ + 40;
	__u8 next;
	int i;

	if (bpf_skb_load_bytes(skb, ETH_HLEN_, ip, 40) < 0)
		return SW_DROP_INVALID;
	f->family = 6;
	__builtin_memcpy(&f->saddr, &ip[8], 16);
	__builtin_memcpy(&f->daddr, &ip[24], 16);
	next = ip[6];
#pragma unroll
	for (i = 0; i < 4; i++) {
		if (next != 0 && next != 43 && next != 60 && next != 44)
			break;
		if (bpf_skb_load_bytes(skb, off, ext, 2) < 0)
			return SW_DROP_CT_INVALID_HDR;
		if (next == 44) {
			__u8 fr[4];

			if (bpf_skb_load_bytes(skb, off, fr, 4) < 0)
				return SW_DROP_CT_INVALID_HDR;
			if (((fr[2] << 8) | fr[3]) & 0xfff8) {
				f->proto = ext[0];
				return SW_PARSED;  /* a later fragment */
			}
			off += 8;
		} else {
			off += (ext[1] + 1) * 8;
		}
		next = ext[0];
	}
	f->proto = next;
	return sw_parse_l4(skb, f, off);
}

/* SW_PARSED, SW_UNTRACKED (pass as it is) or a drop reason. */
static __always_inline int sw_parse(struct __sk_buff *skb, struct sw_flow *f)
{
	f->len = skb->len;
	if (skb->protocol == bpf_htons(ETH_P_IP))
		return sw_parse4(skb, f);
	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return sw_parse6(skb, f);
	return SW_UNTRACKED;
}

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
	struct ipcache_key key = {};
	struct remote_endpoint_info *info;

	if (f->family == 4) {
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

static __always_inline __u8 sw_enforced(__u32 ep)
{
	struct policy_netns *pe = bpf_map_lookup_elem(&policy_endpoints, &ep);

	return pe ? pe->flags : 0;
}

/* 0 when endpoint `ep`'s policy allows `remote` in the direction on
 * proto/dport, else the drop reason: Cilium's lookups, the identity's entry
 * first, then any identity's; a deny in either wins, no entry denies. */
static __always_inline int sw_policy(__u32 ep, __u32 remote, __u8 egress, __u8 proto,
				     __be16 dport)
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

	map = bpf_map_lookup_elem(&policy_maps, &ep);
	if (!map)
		return SW_DROP_POLICY;
	l3 = bpf_map_lookup_elem(map, &key);
	if (l3 && (l3->flags & SW_POLICY_F_DENY))
		return SW_DROP_POLICY_DENY;
	key.sec_label = 0;
	l4 = bpf_map_lookup_elem(map, &key);
	if (l4)
		return (l4->flags & SW_POLICY_F_DENY) ? SW_DROP_POLICY_DENY : 0;
	return l3 ? 0 : SW_DROP_POLICY;
}

/* ------------------------------------------------------------ conntrack */

static __always_inline __u32 sw_now(void)
{
	return (__u32)(bpf_ktime_get_ns() / 1000000000ULL);
}

/* The key of the flow whose first packet went from `src` to `dst`. */
static __always_inline void sw_ct_key(union sw_ct_key *k, const struct sw_flow *f, bool reply,
				      __u8 dir)
{
	const union sw_v6addr *s = reply ? &f->daddr : &f->saddr;
	const union sw_v6addr *d = reply ? &f->saddr : &f->daddr;

	__builtin_memset(k, 0, sizeof(*k));
	if (f->family == 4) {
		__builtin_memcpy(&k->v4.saddr, s, 4);
		__builtin_memcpy(&k->v4.daddr, d, 4);
		k->v4.sport = reply ? f->dport : f->sport;
		k->v4.dport = reply ? f->sport : f->dport;
		k->v4.nexthdr = f->proto;
		k->v4.flags = dir;
	} else {
		k->v6.saddr = *s;
		k->v6.daddr = *d;
		k->v6.sport = reply ? f->dport : f->sport;
		k->v6.dport = reply ? f->sport : f->dport;
		k->v6.nexthdr = f->proto;
		k->v6.flags = dir;
	}
}

static __always_inline struct ct_entry *sw_ct_lookup(const struct sw_flow *f,
						     union sw_ct_key *k)
{
	if (f->family == 4)
		return bpf_map_lookup_elem(&ct4_global, &k->v4);
	return bpf_map_lookup_elem(&ct6_global, &k->v6);
}

static __always_inline bool sw_tcp_syn(const struct sw_flow *f)
{
	return f->proto == SW_IPPROTO_TCP &&
	       (f->tcp_flags & (SW_TCP_SYN | SW_TCP_ACK)) == SW_TCP_SYN;
}

static __always_inline __u32 sw_lifetime(const struct sw_flow *f, __u16 flags, __u32 now)
{
	if (f->proto != SW_IPPROTO_TCP)
		return now + SW_CT_LIFETIME_NONTCP;
	if ((flags & (SW_CT_RX_CLOSING | SW_CT_TX_CLOSING)) ==
	    (SW_CT_RX_CLOSING | SW_CT_TX_CLOSING))
		return now + SW_CT_CLOSE_TIMEOUT;
	if (flags & SW_CT_SEEN_NON_SYN)
		return now + SW_CT_LIFETIME_TCP;
	return now + SW_CT_SYN_TIMEOUT;
}

/* Whether `e` is live for this packet: not expired, and not a closed TCP
 * flow that a new SYN reopens (then the packet starts a new flow). */
static __always_inline bool sw_ct_live(const struct ct_entry *e, const struct sw_flow *f,
				       __u32 now)
{
	if (e->lifetime < now)
		return false;
	if (sw_tcp_syn(f) && (e->flags & (SW_CT_RX_CLOSING | SW_CT_TX_CLOSING)))
		return false;
	return true;
}

/* Account a packet of a live entry, `reply` when it goes against the first
 * packet's direction, and renew the entry. */
static __always_inline void sw_ct_update(struct ct_entry *e, const struct sw_flow *f,
					 bool reply, __u32 now)
{
	__u16 flags = e->flags;

	__sync_fetch_and_add(&e->packets, 1);
	__sync_fetch_and_add(&e->bytes, f->len);
	if (f->proto == SW_IPPROTO_TCP) {
		if (reply)
			e->rx_flags_seen |= f->tcp_flags;
		else
			e->tx_flags_seen |= f->tcp_flags;
		if (f->tcp_flags & SW_TCP_RST)
			flags |= SW_CT_RX_CLOSING | SW_CT_TX_CLOSING;
		else if (f->tcp_flags & SW_TCP_FIN)
			flags |= reply ? SW_CT_RX_CLOSING : SW_CT_TX_CLOSING;
		if (f->tcp_flags & SW_TCP_ACK)
			flags |= SW_CT_SEEN_NON_SYN;
		e->flags = flags;
	}
	e->lifetime = sw_lifetime(f, flags, now);
}

/* 0, or SW_DROP_CT_CREATE_FAILED. */
static __always_inline int sw_ct_create(const struct sw_flow *f, union sw_ct_key *k,
					__u32 src_id, __u32 ifindex, __u32 now)
{
	struct ct_entry e = {
		.packets = 1,
		.bytes = f->len,
		.src_sec_id = src_id,
		.ifindex = (__u16)ifindex,
		.tx_flags_seen = f->tcp_flags,
	};
	long err;

	if (f->proto == SW_IPPROTO_TCP && (f->tcp_flags & SW_TCP_ACK))
		e.flags = SW_CT_SEEN_NON_SYN;
	e.lifetime = sw_lifetime(f, e.flags, now);
	if (f->family == 4)
		err = bpf_map_update_elem(&ct4_global, &k->v4, &e, BPF_ANY);
	else
		err = bpf_map_update_elem(&ct6_global, &k->v6, &e, BPF_ANY);
	return err ? SW_DROP_CT_CREATE_FAILED : 0;
}

/* The packet belongs to a live flow: the entry of the flow this packet
 * replies to (opened in direction `reply_dir`), or of the flow it continues
 * (opened in `dir`). */
static __always_inline bool sw_ct_known(const struct sw_flow *f, __u8 dir, __u8 reply_dir,
					__u32 now)
{
	union sw_ct_key k;
	struct ct_entry *e;

	sw_ct_key(&k, f, true, reply_dir);
	e = sw_ct_lookup(f, &k);
	if (e && sw_ct_live(e, f, now)) {
		sw_ct_update(e, f, true, now);
		return true;
	}
	sw_ct_key(&k, f, false, dir);
	e = sw_ct_lookup(f, &k);
	if (e && sw_ct_live(e, f, now)) {
		sw_ct_update(e, f, false, now);
		return true;
	}
	return false;
}

/* ------------------------------------------------------------ verdicts */

static __always_inline int sw_drop(const struct sw_flow *f, int reason, __u8 dir)
{
	struct metrics_key key = { .reason = (__u8)reason, .dir = dir };
	struct metrics_value *v, init = { .count = 1, .bytes = f->len };

	v = bpf_map_lookup_elem(&metrics, &key);
	if (v) {
		__sync_fetch_and_add(&v->count, 1);
		__sync_fetch_and_add(&v->bytes, f->len);
	} else if (bpf_map_update_elem(&metrics, &key, &init, BPF_NOEXIST)) {
		v = bpf_map_lookup_elem(&metrics, &key);
		if (v) {
			__sync_fetch_and_add(&v->count, 1);
			__sync_fetch_and_add(&v->bytes, f->len);
		}
	}
	return TC_ACT_SHOT;
}

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

	ret = sw_parse(skb, &f);
	if (ret == SW_UNTRACKED)
		return TC_ACT_OK;
	if (ret)
		return sw_drop(&f, ret, SW_METRIC_INGRESS);
	ep = sw_endpoint(&f, &f.daddr);
	if (!ep)
		return TC_ACT_OK;
	ep_id = ep->lxc_id;
	now = sw_now();
	if (sw_ct_known(&f, SW_CT_F_INGRESS, SW_CT_F_EGRESS, now))
		return TC_ACT_OK;
	src = sw_identity(&f, &f.saddr);
	if (src != SW_IDENTITY_HOST && (sw_enforced(ep_id) & SW_POLICY_NETNS_F_INGRESS)) {
		ret = sw_policy(ep_id, src, 0, f.proto, sw_policy_port(&f));
		if (ret)
			return sw_drop(&f, ret, SW_METRIC_INGRESS);
	}
	sw_ct_key(&k, &f, false, SW_CT_F_INGRESS);
	ret = sw_ct_create(&f, &k, src, skb->ifindex, now);
	if (ret)
		return sw_drop(&f, ret, SW_METRIC_INGRESS);
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

	ret = sw_parse(skb, &f);
	if (ret == SW_UNTRACKED)
		return TC_ACT_OK;
	if (ret)
		return sw_drop(&f, ret, SW_METRIC_EGRESS);
	ep = sw_endpoint(&f, &f.saddr);
	if (!ep)
		return TC_ACT_OK;
	ep_id = ep->lxc_id;
	now = sw_now();
	if (sw_ct_known(&f, SW_CT_F_EGRESS, SW_CT_F_INGRESS, now))
		return TC_ACT_OK;
	if (!sw_socket_proto(f.proto) && (sw_enforced(ep_id) & SW_POLICY_NETNS_F_EGRESS)) {
		ret = sw_policy(ep_id, sw_identity(&f, &f.daddr), 1, f.proto, sw_policy_port(&f));
		if (ret)
			return sw_drop(&f, ret, SW_METRIC_EGRESS);
	}
	sw_ct_key(&k, &f, false, SW_CT_F_EGRESS);
	ret = sw_ct_create(&f, &k, ep->sec_id, skb->ifindex, now);
	if (ret)
		return sw_drop(&f, ret, SW_METRIC_EGRESS);
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
