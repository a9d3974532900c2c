// SPDX-License-Identifier: Apache-2.0
/* Statewright: north-south services on the node's external devices
 * (docs/datapath.md): NodePort, LoadBalancer and externalIPs for clients outside
 * the node. Our own small program, in the spirit of Cilium's bpf_host/nodeport.
 *
 * sw_nodeport_in  (ingress of each external device: packets arriving)
 * sw_nodeport_out (egress of each external device: packets leaving)
 *
 * Like a PREROUTING DNAT and a POSTROUTING SNAT: the ingress program translates
 * before the kernel routes, the egress program after it.
 *
 * Ingress:
 *  1. a reply from a backend on another node to this node's NAT port (a
 *     REV_SNAT entry of include/nat.h): the destination becomes the client again;
 *  2. a TCP or UDP packet to a frontend of the LB maps whose service is a
 *     NodePort, LoadBalancer or externalIPs one (external scope: with
 *     externalTrafficPolicy Local that entry lists only this node's backends):
 *     - a packet of a live service flow (ct4/ct6_global, tuple flag
 *       SW_CT_F_SERVICE, keyed by client and frontend) keeps its backend;
 *     - a new flow is checked against the service's source ranges, then gets a
 *       backend by the socket program's rules: the client's affinity entry
 *       (lb{4,6}_affinity keyed by the client address) while valid, else the
 *       maglev table (hashed on client address and frontend, so a client keeps
 *       its backend across connections), else a random active slot
 *       (quarantined backends sit beyond `count` and are never chosen); no
 *       active backend: dropped (158, as Cilium);
 *     - the destination becomes the backend (DNAT) and a REV_DNAT entry
 *       remembers the frontend for the replies, flagged NEEDS_SNAT when the
 *       backend is neither a local endpoint nor this host.
 * Egress:
 *  1. a client's packet to a remote backend (an SNAT entry, or a first packet
 *     whose REV_DNAT entry needs SNAT: a NAT port is allocated on the device's
 *     address from nodeport_devices): the source becomes this node;
 *  2. a backend's reply to a client (REV_DNAT entry, while the service flow's
 *     CT entry lives; a stale entry is removed): the source becomes the
 *     frontend, and the CT entry is renewed as a reply.
 * A TCP SYN straight to a backend address (no frontend) removes the REV_DNAT
 * entry an earlier service flow of the same client port left for that tuple.
 *
 * Events (include/events.h, when the agent's monitor turned them on): every
 * drop, with its reason, and the translation of each new service flow from
 * outside (frontend and chosen backend), both with the client's identity.
 *
 * Everything else (other protocols, IPv4 later fragments, addresses that are no
 * frontend) passes untouched; the socket program keeps serving east-west
 * traffic from the node's own sockets. Policy stays with the endpoint programs:
 * a DNATed packet reaches the pod's veth with the client's address (or this
 * node's, once masqueraded to another node) and is checked there.
 */
#define SW_DEFINE_MAPS
#include <stdbool.h>
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "include/lb.h"
#include "include/lb_select.h"
#include "include/endpoints.h"
#include "include/ipcache.h"
#include "include/ct.h"
#include "include/nat.h"
#include "include/flow.h"
#include "include/events.h"

#define SW_IDENTITY_HOST 1
#define SW_NAT_PORT_MIN 32768
#define SW_NAT_PORT_MAX 65535
#define SW_NAT_TRIES 16
#define SW_SVC_F_NORTH_SOUTH \
	(SW_SVC_F_NODE_PORT | SW_SVC_F_LOAD_BALANCER | SW_SVC_F_EXTERNAL_IPS)

#define SW_IP4_CSUM_OFF (ETH_HLEN_ + 10)
#define SW_IP4_SRC_OFF (ETH_HLEN_ + 12)
#define SW_IP4_DST_OFF (ETH_HLEN_ + 16)
#define SW_IP6_SRC_OFF (ETH_HLEN_ + 8)
#define SW_IP6_DST_OFF (ETH_HLEN_ + 24)

/* Either family's services-map key (the values have one layout). */
union sw_lb_key {
	struct lb4_key v4;
	struct lb6_key v6;
};

/* A NAT entry of either family, as the programs use it. */
struct sw_nat {
	union sw_v6addr addr;
	__be16 port;
	__be16 rev_nat_index;
	__u32 flags;
};

/* ------------------------------------------------------------ events */

/* Report flow `f` (include/events.h): its addresses as the packet has them
 * now, `fe` the frontend the client asked for (NULL: none), the identities
 * from the ipcache. The event is reserved in the ring: the callers' stack has
 * no room for one. */
static __always_inline void sw_np_event(const struct sw_flow *f, __u8 type, int reason,
					__u8 dir, const struct sw_nat *fe)
{
	struct sw_event *ev = sw_event_reserve();

	if (!ev)
		return;
	ev->type = type;
	ev->verdict = reason ? SW_EVENT_VERDICT_DROPPED : SW_EVENT_VERDICT_FORWARDED;
	ev->reason = (__u8)reason;
	ev->dir = dir;
	ev->family = f->family;
	ev->proto = f->proto;
	ev->lpm = SW_EVENT_NO_LPM;
	ev->source = SW_EVENT_SRC_NODEPORT;
	ev->src_identity = sw_ipcache_identity(f->family, &f->saddr);
	ev->dst_identity = sw_ipcache_identity(f->family, &f->daddr);
	ev->sport = f->sport;
	ev->dport = f->dport;
	__builtin_memcpy(ev->saddr, &f->saddr, 16);
	__builtin_memcpy(ev->daddr, &f->daddr, 16);
	if (fe) {
		ev->orig_dport = fe->port;
		__builtin_memcpy(ev->orig_daddr, &fe->addr, 16);
	}
	sw_event_submit(ev);
}

/* Count and report a drop (of a packet to frontend `fe`, or NULL), then drop. */
static __always_inline int sw_np_drop(const struct sw_flow *f, int reason, __u8 dir,
				      const struct sw_nat *fe)
{
	sw_np_event(f, SW_EVENT_DROP, reason, dir, fe);
	return sw_drop(f, reason, dir);
}

/* ------------------------------------------------------------ rewriting */

/* Set the source (`src`) or destination address and port of the packet to
 * addr:port, fixing the checksums, and `f` with it: 0 or a drop reason. */
static __always_inline int sw_rewrite(struct __sk_buff *skb, struct sw_flow *f, bool src,
				      const union sw_v6addr *addr, __be16 port)
{
	__u32 csum_off = f->l4_off + (f->proto == SW_IPPROTO_TCP ? 16 : 6);
	__u64 mangled = f->proto == SW_IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
	union sw_v6addr old = src ? f->saddr : f->daddr;
	union sw_v6addr new = *addr;
	__be16 old_port = src ? f->sport : f->dport;
	__be32 o4, n4;
	__s64 diff;

	if (f->family == 4) {
		o4 = old.p1;
		n4 = new.p1;
		if (bpf_l4_csum_replace(skb, csum_off, o4, n4, BPF_F_PSEUDO_HDR | mangled | 4))
			return SW_DROP_CSUM_L4;
		if (bpf_l3_csum_replace(skb, SW_IP4_CSUM_OFF, o4, n4, 4))
			return SW_DROP_CSUM_L3;
		if (bpf_skb_store_bytes(skb, src ? SW_IP4_SRC_OFF : SW_IP4_DST_OFF, &n4, 4, 0))
			return SW_DROP_WRITE_ERROR;
	} else {
		diff = bpf_csum_diff((__be32 *)&old, 16, (__be32 *)&new, 16, 0);
		if (diff < 0)
			return SW_DROP_CSUM_L4;
		if (bpf_l4_csum_replace(skb, csum_off, 0, diff, BPF_F_PSEUDO_HDR | mangled))
			return SW_DROP_CSUM_L4;
		if (bpf_skb_store_bytes(skb, src ? SW_IP6_SRC_OFF : SW_IP6_DST_OFF, &new, 16, 0))
			return SW_DROP_WRITE_ERROR;
	}
	if (old_port != port) {
		if (bpf_l4_csum_replace(skb, csum_off, old_port, port, mangled | 2))
			return SW_DROP_CSUM_L4;
		if (bpf_skb_store_bytes(skb, f->l4_off + (src ? 0 : 2), &port, 2, 0))
			return SW_DROP_WRITE_ERROR;
	}
	if (src) {
		f->saddr = new;
		f->sport = port;
	} else {
		f->daddr = new;
		f->dport = port;
	}
	return 0;
}

/* ------------------------------------------------------------ NAT entries */

/* A NAT entry's lifetime after this packet: closing TCP flows short, TCP
 * handshakes a minute, established TCP six hours, the rest a minute. */
static __always_inline __u32 sw_nat_lifetime(const struct sw_flow *f, __u32 now)
{
	if (f->proto != SW_IPPROTO_TCP)
		return now + SW_CT_LIFETIME_NONTCP;
	if (f->tcp_flags & (SW_TCP_FIN | SW_TCP_RST))
		return now + SW_CT_CLOSE_TIMEOUT;
	if (sw_tcp_syn(f))
		return now + SW_CT_SYN_TIMEOUT;
	return now + SW_CT_LIFETIME_TCP;
}

/* The live NAT entry of key `k` into *out, renewed by this packet. */
static __always_inline bool sw_nat_get(const struct sw_flow *f, union sw_ct_key *k,
				       struct sw_nat *out, __u32 now)
{
	struct nat4_entry *e4;
	struct nat6_entry *e6;

	if (f->family == 4) {
		e4 = bpf_map_lookup_elem(&nodeport_nat4, &k->v4);
		if (!e4 || e4->lifetime < now)
			return false;
		e4->lifetime = sw_nat_lifetime(f, now);
		__builtin_memset(&out->addr, 0, sizeof(out->addr));
		out->addr.p1 = e4->to_addr;
		out->port = e4->to_port;
		out->rev_nat_index = e4->rev_nat_index;
		out->flags = e4->flags;
		return true;
	}
	e6 = bpf_map_lookup_elem(&nodeport_nat6, &k->v6);
	if (!e6 || e6->lifetime < now)
		return false;
	e6->lifetime = sw_nat_lifetime(f, now);
	out->addr = e6->to_addr;
	out->port = e6->to_port;
	out->rev_nat_index = e6->rev_nat_index;
	out->flags = e6->flags;
	return true;
}

/* Write the NAT entry of key `k` (BPF_ANY or BPF_NOEXIST): 0 or -errno. */
static __always_inline long sw_nat_put(const struct sw_flow *f, union sw_ct_key *k,
				       const struct sw_nat *v, __u32 now, __u64 mode)
{
	struct nat4_entry e4 = {};
	struct nat6_entry e6 = {};

	if (f->family == 4) {
		e4.to_addr = v->addr.p1;
		e4.to_port = v->port;
		e4.rev_nat_index = v->rev_nat_index;
		e4.lifetime = sw_nat_lifetime(f, now);
		e4.flags = v->flags;
		return bpf_map_update_elem(&nodeport_nat4, &k->v4, &e4, mode);
	}
	e6.to_addr = v->addr;
	e6.to_port = v->port;
	e6.rev_nat_index = v->rev_nat_index;
	e6.lifetime = sw_nat_lifetime(f, now);
	e6.flags = v->flags;
	return bpf_map_update_elem(&nodeport_nat6, &k->v6, &e6, mode);
}

static __always_inline void sw_nat_del(const struct sw_flow *f, union sw_ct_key *k)
{
	if (f->family == 4)
		bpf_map_delete_elem(&nodeport_nat4, &k->v4);
	else
		bpf_map_delete_elem(&nodeport_nat6, &k->v6);
}

/* ------------------------------------------------------------ services */

static __always_inline struct lb4_service *sw_svc(const struct sw_flow *f, union sw_lb_key *k)
{
	if (f->family == 4)
		return bpf_map_lookup_elem(&lb4_services, &k->v4);
	return (struct lb4_service *)bpf_map_lookup_elem(&lb6_services, &k->v6);
}

/* The external-scope frontend entry for the packet's destination: exact, then
 * protocol ANY, then the address's wildcard entry <vip>:0/ANY. `k` is left as
 * the key that matched (its slots are read with it). */
static __always_inline struct lb4_service *sw_frontend(const struct sw_flow *f,
						       union sw_lb_key *k)
{
	struct lb4_service *svc;

	__builtin_memset(k, 0, sizeof(*k));
	if (f->family == 4) {
		k->v4.address = f->daddr.p1;
		k->v4.dport = f->dport;
		k->v4.proto = f->proto;
	} else {
		k->v6.address = f->daddr;
		k->v6.dport = f->dport;
		k->v6.proto = f->proto;
	}
	svc = sw_svc(f, k);
	if (svc)
		return svc;
	if (f->family == 4)
		k->v4.proto = 0;
	else
		k->v6.proto = 0;
	svc = sw_svc(f, k);
	if (svc)
		return svc;
	if (f->family == 4)
		k->v4.dport = 0;
	else
		k->v6.dport = 0;
	return sw_svc(f, k);
}

static __always_inline __u32 sw_slot_backend(const struct sw_flow *f, union sw_lb_key *k,
					     __u16 slot)
{
	struct lb4_service *s;

	if (f->family == 4)
		k->v4.backend_slot = slot;
	else
		k->v6.backend_slot = slot;
	s = sw_svc(f, k);
	return s ? s->backend_id : 0;
}

/* The backend's address and port; false when the id is unknown. */
static __always_inline bool sw_backend(const struct sw_flow *f, __u32 id, union sw_v6addr *addr,
				       __be16 *port)
{
	struct lb4_backend *b4;
	struct lb6_backend *b6;

	if (f->family == 4) {
		b4 = bpf_map_lookup_elem(&lb4_backends, &id);
		if (!b4)
			return false;
		__builtin_memset(addr, 0, sizeof(*addr));
		addr->p1 = b4->address;
		*port = b4->port;
		return true;
	}
	b6 = bpf_map_lookup_elem(&lb6_backends, &id);
	if (!b6)
		return false;
	*addr = b6->address;
	*port = b6->port;
	return true;
}

/* Whether the client may use the service: its source ranges (LoadBalancer
 * loadBalancerSourceRanges), an allow list, or a deny list with the flag. */
static __always_inline bool sw_source_allowed(const struct sw_flow *f,
					      const struct lb4_service *svc)
{
	struct lb4_src_range_key k4 = {};
	struct lb6_src_range_key k6 = {};
	bool deny = svc->flags2 & SW_SVC_F2_SOURCE_RANGE_DENY;
	void *found;

	if (!(svc->flags & SW_SVC_F_SOURCE_RANGE))
		return true;
	if (f->family == 4) {
		k4.prefixlen = 32 + 32;
		k4.rev_nat_id = svc->rev_nat_index;
		k4.addr = f->saddr.p1;
		found = bpf_map_lookup_elem(&lb4_source_range, &k4);
	} else {
		k6.prefixlen = 32 + 128;
		k6.rev_nat_id = svc->rev_nat_index;
		k6.addr = f->saddr;
		found = bpf_map_lookup_elem(&lb6_source_range, &k6);
	}
	return deny ? !found : found != NULL;
}

/* The client's affinity key for the service (client address, not a cookie). */
static __always_inline void sw_affinity_key(const struct sw_flow *f, __be16 rev_nat_index,
					    struct lb6_affinity_key *k)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->client_id.client_ip = f->saddr;
	k->rev_nat_id = bpf_ntohs(rev_nat_index);
}

static __always_inline void *sw_affinity_map(const struct sw_flow *f)
{
	return f->family == 4 ? (void *)&lb4_affinity : (void *)&lb6_affinity;
}

/* The backend the client's affinity entry still pins, or 0. */
static __always_inline __u32 sw_affinity_get(const struct sw_flow *f,
					     const struct lb4_service *svc, __u64 now)
{
	__u32 timeout = svc->affinity_timeout & SW_AFFINITY_TIMEOUT_MASK;
	struct lb_affinity_match match = {};
	struct lb6_affinity_key k6;
	struct lb4_affinity_key k4;
	struct lb_affinity_val *cur;
	void *map = sw_affinity_map(f), *key;
	bool backend_known;

	sw_affinity_key(f, svc->rev_nat_index, &k6);
	if (f->family == 4) {
		__builtin_memset(&k4, 0, sizeof(k4));
		k4.client_id.client_ip = f->saddr.p1;
		k4.rev_nat_id = k6.rev_nat_id;
		key = &k4;
	} else {
		key = &k6;
	}
	cur = bpf_map_lookup_elem(map, key);
	if (!cur)
		return 0;
	match.backend_id = cur->backend_id;
	match.rev_nat_id = svc->rev_nat_index;
	backend_known = f->family == 4 ? !!bpf_map_lookup_elem(&lb4_backends, &match.backend_id)
				       : !!bpf_map_lookup_elem(&lb6_backends, &match.backend_id);
	if (cur->last_used + timeout > now && backend_known &&
	    bpf_map_lookup_elem(&lb_affinity_match, &match)) {
		cur->last_used = now;
		return match.backend_id;
	}
	bpf_map_delete_elem(map, key);
	return 0;
}

static __always_inline void sw_affinity_put(const struct sw_flow *f,
					    const struct lb4_service *svc, __u32 backend_id,
					    __u64 now)
{
	struct lb_affinity_val v = { .last_used = now, .backend_id = backend_id };
	struct lb6_affinity_key k6;
	struct lb4_affinity_key k4;

	sw_affinity_key(f, svc->rev_nat_index, &k6);
	if (f->family == 4) {
		__builtin_memset(&k4, 0, sizeof(k4));
		k4.client_id.client_ip = f->saddr.p1;
		k4.rev_nat_id = k6.rev_nat_id;
		bpf_map_update_elem(&lb4_affinity, &k4, &v, BPF_ANY);
	} else {
		bpf_map_update_elem(&lb6_affinity, &k6, &v, BPF_ANY);
	}
}

/* Maglev's hash of a client: its address and the frontend, not the source
 * port, as the socket program hashes its clients. */
static __always_inline __u32 sw_client_hash(const struct sw_flow *f)
{
	__u32 h = 0x5357;

	h = sw_hash_mix(h, f->saddr.p1);
	h = sw_hash_mix(h, f->saddr.p2);
	h = sw_hash_mix(h, f->saddr.p3);
	h = sw_hash_mix(h, f->saddr.p4);
	h = sw_hash_mix(h, f->daddr.p1);
	h = sw_hash_mix(h, f->daddr.p2);
	h = sw_hash_mix(h, f->daddr.p3);
	h = sw_hash_mix(h, f->daddr.p4);
	h = sw_hash_mix(h, f->dport);
	return sw_hash_final(h);
}

/* A backend id for a new flow to `svc` (master slot copy), or 0. */
static __always_inline __u32 sw_select(const struct sw_flow *f, union sw_lb_key *k,
				       const struct lb4_service *svc)
{
	bool affinity = svc->flags & SW_SVC_F_AFFINITY;
	__u32 alg = svc->backend_id >> SW_LB_ALG_SHIFT;
	__u64 now = sw_now_sec();
	__u32 backend_id = 0;

	if (affinity) {
		backend_id = sw_affinity_get(f, svc, now);
		if (backend_id)
			return backend_id;
	}
	if (alg != SW_LB_ALG_RANDOM) {
		if (f->family == 4)
			backend_id = sw_maglev_backend(&lb4_maglev, svc->rev_nat_index,
						       sw_client_hash(f));
		else
			backend_id = sw_maglev_backend(&lb6_maglev, svc->rev_nat_index,
						       sw_client_hash(f));
	}
	if (!backend_id)
		backend_id = sw_slot_backend(f, k, bpf_get_prandom_u32() % svc->count + 1);
	if (affinity && backend_id)
		sw_affinity_put(f, svc, backend_id, now);
	return backend_id;
}

/* Whether a backend address is on this node: a local endpoint, or this host. */
static __always_inline bool sw_backend_local(const struct sw_flow *f,
					     const union sw_v6addr *addr)
{
	struct endpoint_key ek = {};
	struct ipcache_key ik = {};
	struct remote_endpoint_info *info;

	if (f->family == 4) {
		ek.ip4 = addr->p1;
		ek.family = SW_FAMILY_IPV4;
		ik.prefixlen = 32 + 32;
		ik.family = SW_FAMILY_IPV4;
		ik.ip4 = addr->p1;
	} else {
		ek.ip6 = *addr;
		ek.family = SW_FAMILY_IPV6;
		ik.prefixlen = 32 + 128;
		ik.family = SW_FAMILY_IPV6;
		ik.ip6 = *addr;
	}
	if (bpf_map_lookup_elem(&endpoints, &ek))
		return true;
	info = bpf_map_lookup_elem(&ipcache, &ik);
	return info && info->sec_identity == SW_IDENTITY_HOST;
}

/* The REV_DNAT entry of the flow client -> backend (the packet after DNAT):
 * renewed, or written when missing or stale. 0 or a drop reason. */
static __always_inline int sw_rev_dnat_keep(const struct sw_flow *f, const struct sw_nat *fe,
					    __u32 now)
{
	union sw_ct_key k;
	struct sw_nat cur;

	sw_ct_key(&k, f, true, SW_NAT_F_REV_DNAT);
	if (sw_nat_get(f, &k, &cur, now) && cur.port == fe->port &&
	    cur.rev_nat_index == fe->rev_nat_index && cur.addr.p1 == fe->addr.p1 &&
	    cur.addr.p4 == fe->addr.p4)
		return 0;
	return sw_nat_put(f, &k, fe, now, BPF_ANY) ? SW_DROP_NAT_NO_MAPPING : 0;
}

/* A packet to a north-south frontend: DNAT to the flow's backend. TC_ACT_OK
 * or a drop. */
static __always_inline int sw_serve(struct __sk_buff *skb, struct sw_flow *f,
				    union sw_lb_key *k, const struct lb4_service *found, __u32 now)
{
	struct lb4_service svc = *found;
	struct sw_nat fe = { .addr = f->daddr, .port = f->dport };
	union sw_v6addr baddr;
	union sw_ct_key ck;
	struct ct_entry *e, ne;
	__u32 backend_id = 0;
	bool fresh = false;
	__be16 bport;
	int ret;

	sw_ct_key(&ck, f, false, SW_CT_F_SERVICE);
	e = sw_ct_lookup(f, &ck);
	if (e && sw_ct_live(e, f, now) && sw_backend(f, (__u32)e->backend_id, &baddr, &bport)) {
		sw_ct_update(e, f, false, now);
		fe.rev_nat_index = e->rev_nat_index;
	} else {
		if (svc.count == 0)
			return sw_np_drop(f, SW_DROP_NO_SERVICE, SW_METRIC_INGRESS, &fe);
		if (!sw_source_allowed(f, &svc))
			return sw_np_drop(f, SW_DROP_NOT_IN_SRC_RANGE, SW_METRIC_INGRESS, &fe);
		backend_id = sw_select(f, k, &svc);
		if (!backend_id || !sw_backend(f, backend_id, &baddr, &bport))
			return sw_np_drop(f, SW_DROP_NO_SERVICE, SW_METRIC_INGRESS, &fe);
		sw_ct_init(&ne, f, now);
		ne.backend_id = backend_id;
		ne.rev_nat_index = svc.rev_nat_index;
		ne.flags |= SW_CT_NODE_PORT;
		ne.ifindex = (__u16)skb->ifindex;
		if (sw_ct_insert(f, &ck, &ne))
			return sw_np_drop(f, SW_DROP_CT_CREATE_FAILED, SW_METRIC_INGRESS, &fe);
		fe.rev_nat_index = svc.rev_nat_index;
		fresh = true;
	}
	ret = sw_rewrite(skb, f, false, &baddr, bport);
	if (ret)
		return sw_np_drop(f, ret, SW_METRIC_INGRESS, &fe);
	if (!sw_backend_local(f, &baddr))
		fe.flags = SW_NAT_E_NEEDS_SNAT;
	ret = sw_rev_dnat_keep(f, &fe, now);
	if (ret)
		return sw_np_drop(f, ret, SW_METRIC_INGRESS, &fe);
	if (fresh)  /* a new flow's translation; its next packets report nothing */
		sw_np_event(f, SW_EVENT_TRACE, 0, SW_METRIC_INGRESS, &fe);
	return TC_ACT_OK;
}

static __always_inline bool sw_nat_proto(const struct sw_flow *f)
{
	return (f->proto == SW_IPPROTO_TCP || f->proto == SW_IPPROTO_UDP) && f->l4_off;
}

SEC("tc")
int sw_nodeport_in(struct __sk_buff *skb)
{
	struct sw_flow f = {};
	struct lb4_service *svc;
	union sw_lb_key k;
	union sw_ct_key nk;
	struct sw_nat nat;
	__u32 now;
	int ret;

	if (sw_parse(skb, &f) != SW_PARSED || !sw_nat_proto(&f))
		return TC_ACT_OK;
	now = sw_now();
	sw_ct_key(&nk, &f, false, SW_NAT_F_REV_SNAT);
	if (sw_nat_get(&f, &nk, &nat, now)) {
		ret = sw_rewrite(skb, &f, false, &nat.addr, nat.port);
		return ret ? sw_np_drop(&f, ret, SW_METRIC_INGRESS, NULL) : TC_ACT_OK;
	}
	svc = sw_frontend(&f, &k);
	if (svc && (svc->flags & SW_SVC_F_NORTH_SOUTH))
		return sw_serve(skb, &f, &k, svc, now);
	if (sw_tcp_syn(&f)) {
		/* A new connection straight to an address and port an earlier service
		 * flow of this client used: that flow's replies are no longer ours. */
		sw_ct_key(&nk, &f, true, SW_NAT_F_REV_DNAT);
		sw_nat_del(&f, &nk);
	}
	return TC_ACT_OK;
}

/* ------------------------------------------------------------ egress */

/* Masquerade the first packet of a client's flow to a backend on another node:
 * a NAT port on the leaving device's address, the REV_SNAT entry claiming it
 * and the SNAT entry for the flow's next packets. TC_ACT_OK or a drop. */
static __always_inline int sw_snat_new(struct __sk_buff *skb, struct sw_flow *f,
				       const struct sw_nat *fe, __u32 now)
{
	__u32 ifindex = skb->ifindex;
	struct nodeport_device *dev = bpf_map_lookup_elem(&nodeport_devices, &ifindex);
	struct sw_nat rev = { .addr = f->saddr, .port = f->sport,
			      .rev_nat_index = fe->rev_nat_index };
	struct sw_nat fwd = { .rev_nat_index = fe->rev_nat_index };
	union sw_ct_key rk, fk;
	struct sw_flow r;
	__u16 port;
	int i, ret;

	if (!dev)
		return sw_np_drop(f, SW_DROP_NAT_NO_MAPPING, SW_METRIC_EGRESS, NULL);
	if (f->family == 4) {
		if (!(dev->flags & SW_NODEPORT_DEV_IPV4))
			return sw_np_drop(f, SW_DROP_NAT_NO_MAPPING, SW_METRIC_EGRESS, NULL);
		fwd.addr.p1 = dev->ip4;
	} else {
		if (!(dev->flags & SW_NODEPORT_DEV_IPV6))
			return sw_np_drop(f, SW_DROP_NAT_NO_MAPPING, SW_METRIC_EGRESS, NULL);
		fwd.addr = dev->ip6;
	}
	/* The reply's view: backend -> this node:port. */
	r = *f;
	r.saddr = f->daddr;
	r.sport = f->dport;
	r.daddr = fwd.addr;
	port = bpf_ntohs(f->sport);
	if (port < SW_NAT_PORT_MIN)
		port = SW_NAT_PORT_MIN + bpf_get_prandom_u32() % (SW_NAT_PORT_MAX - SW_NAT_PORT_MIN + 1);
	for (i = 0; i < SW_NAT_TRIES; i++) {
		r.dport = bpf_htons(port);
		sw_ct_key(&rk, &r, false, SW_NAT_F_REV_SNAT);
		if (!sw_nat_put(&r, &rk, &rev, now, BPF_NOEXIST))
			break;
		port = SW_NAT_PORT_MIN + bpf_get_prandom_u32() % (SW_NAT_PORT_MAX - SW_NAT_PORT_MIN + 1);
	}
	if (i == SW_NAT_TRIES)
		return sw_np_drop(f, SW_DROP_NAT_NO_MAPPING, SW_METRIC_EGRESS, NULL);
	fwd.port = bpf_htons(port);
	sw_ct_key(&fk, f, false, SW_NAT_F_SNAT);
	if (sw_nat_put(f, &fk, &fwd, now, BPF_ANY)) {
		sw_nat_del(&r, &rk);
		return sw_np_drop(f, SW_DROP_NAT_NO_MAPPING, SW_METRIC_EGRESS, NULL);
	}
	ret = sw_rewrite(skb, f, true, &fwd.addr, fwd.port);
	return ret ? sw_np_drop(f, ret, SW_METRIC_EGRESS, NULL) : TC_ACT_OK;
}

/* Renew the service flow's CT entry with a reply (the packet backend -> client,
 * `fe` the frontend the client talks to); false when there is no such live flow
 * (the REV_DNAT entry outlived it). */
static __always_inline bool sw_service_reply(const struct sw_flow *f, const struct sw_nat *fe,
					     __u32 now)
{
	struct sw_flow orig = *f;
	union sw_ct_key ck;
	struct ct_entry *e;

	orig.saddr = f->daddr;
	orig.sport = f->dport;
	orig.daddr = fe->addr;
	orig.dport = fe->port;
	sw_ct_key(&ck, &orig, false, SW_CT_F_SERVICE);
	e = sw_ct_lookup(&orig, &ck);
	if (!e || e->lifetime < now)
		return false;
	sw_ct_update(e, f, true, now);
	return true;
}

SEC("tc")
int sw_nodeport_out(struct __sk_buff *skb)
{
	struct sw_flow f = {};
	union sw_ct_key k;
	struct sw_nat nat;
	__u32 now;
	int ret;

	if (sw_parse(skb, &f) != SW_PARSED || !sw_nat_proto(&f))
		return TC_ACT_OK;
	now = sw_now();
	sw_ct_key(&k, &f, false, SW_NAT_F_SNAT);
	if (sw_nat_get(&f, &k, &nat, now)) {
		ret = sw_rewrite(skb, &f, true, &nat.addr, nat.port);
		return ret ? sw_np_drop(&f, ret, SW_METRIC_EGRESS, NULL) : TC_ACT_OK;
	}
	sw_ct_key(&k, &f, false, SW_NAT_F_REV_DNAT);
	if (sw_nat_get(&f, &k, &nat, now)) {
		if (!sw_service_reply(&f, &nat, now)) {
			sw_nat_del(&f, &k);
			return TC_ACT_OK;
		}
		ret = sw_rewrite(skb, &f, true, &nat.addr, nat.port);
		return ret ? sw_np_drop(&f, ret, SW_METRIC_EGRESS, NULL) : TC_ACT_OK;
	}
	/* A client's packet to a backend: its reply's REV_DNAT entry says whether
	 * the backend is on another node. */
	sw_ct_key(&k, &f, true, SW_NAT_F_REV_DNAT);
	if (sw_nat_get(&f, &k, &nat, now) && (nat.flags & SW_NAT_E_NEEDS_SNAT))
		return sw_snat_new(skb, &f, &nat, now);
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
