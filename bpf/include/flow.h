/* SPDX-License-Identifier: Apache-2.0 */
/* Statewright: what the tc programs share (bpf/lxc.c, bpf/nodeport.c): parsing a
 * packet into its flow (addresses, ports, protocol, TCP flags), connection tracking
 * on the CT maps of ct.h (keys, lifetimes by protocol and TCP state, lookup, renewal,
 * creation) and drops counted by reason and direction in `metrics`.
 *
 * Include after defining SW_DEFINE_MAPS (the CT maps and `metrics` are used). */
#ifndef STATEWRIGHT_FLOW_H
#define STATEWRIGHT_FLOW_H

#include <stdbool.h>
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "ct.h"

#define SW_IPPROTO_ICMP 1
#define SW_IPPROTO_TCP 6
#define SW_IPPROTO_UDP 17
#define SW_IPPROTO_ICMPV6 58
#define SW_IPPROTO_SCTP 132

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
	__u32 l4_off;  /* where the L4 header starts; 0 in a later fragment */
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

	f->l4_off = off;
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

/* A new entry for the flow of `f`'s first packet, to be completed by the
 * caller and written by sw_ct_insert. */
static __always_inline void sw_ct_init(struct ct_entry *e, const struct sw_flow *f, __u32 now)
{
	__builtin_memset(e, 0, sizeof(*e));
	e->packets = 1;
	e->bytes = f->len;
	e->tx_flags_seen = f->tcp_flags;
	if (f->proto == SW_IPPROTO_TCP && (f->tcp_flags & SW_TCP_ACK))
		e->flags = SW_CT_SEEN_NON_SYN;
	e->lifetime = sw_lifetime(f, e->flags, now);
}

/* 0, or SW_DROP_CT_CREATE_FAILED. */
static __always_inline int sw_ct_insert(const struct sw_flow *f, union sw_ct_key *k,
					const struct ct_entry *e)
{
	long err;

	if (f->family == 4)
		err = bpf_map_update_elem(&ct4_global, &k->v4, e, BPF_ANY);
	else
		err = bpf_map_update_elem(&ct6_global, &k->v6, e, BPF_ANY);
	return err ? SW_DROP_CT_CREATE_FAILED : 0;
}

/* A new entry for an endpoint's flow: 0, or SW_DROP_CT_CREATE_FAILED. */
static __always_inline int sw_ct_create(const struct sw_flow *f, union sw_ct_key *k,
					__u32 src_id, __u32 ifindex, __u32 now)
{
	struct ct_entry e;

	sw_ct_init(&e, f, now);
	e.src_sec_id = src_id;
	e.ifindex = (__u16)ifindex;
	return sw_ct_insert(f, k, &e);
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

/* ------------------------------------------------------------ drops */

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

#endif /* STATEWRIGHT_FLOW_H */
