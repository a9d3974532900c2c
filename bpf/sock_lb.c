// SPDX-License-Identifier: Apache-2.0
/* Statewright: socket-level load balancer for cgroup v2.
 *
 * The programs run when a process of the cgroup connects a socket (TCP and
 * connected UDP), sends an unconnected UDP datagram, receives one with its
 * source address, or asks for its peer's address. A destination that is a
 * service frontend in lb{4,6}_services is rewritten to one of the service's
 * backends before the kernel routes anything, so no packet ever carries the
 * service address; recvmsg and getpeername rewrite the backend back to the
 * service address so applications only ever see the address they asked for.
 *
 * Maps: every LB map of include/lb.h (written by bpfops' FrontendOps and
 * reused from their pins by bpf/datapath.py), plus the datapath's own
 * reverse-translation maps of include/sock_lb.h.
 *
 * Frontend lookup: the exact (address, port, protocol) entry, then the same
 * with protocol ANY (entries written by older versions), preferring the
 * internal-scope entry of a two-scope service (a socket's client is always
 * inside the cluster), then the NodePort/HostPort surrogate 0.0.0.0:port for
 * loopback destinations, then the VIP's wildcard entry <vip>:0/ANY. The
 * wildcard entry has no backends, so traffic to an unknown port of a service
 * address is refused rather than leaked to the network.
 *
 * Backend choice, in order: the session-affinity entry of the client's
 * network namespace (lb4_affinity keyed by the netns cookie, valid while
 * younger than the service's affinity timeout and while the backend is still
 * in lb_affinity_match); the maglev table of the service when its algorithm
 * is maglev, or undefined and a table is installed (the control plane only
 * installs tables for maglev frontends), indexed by a hash of the client
 * (its netns cookie and the socket's bound source address, if any; not the
 * source port, which is usually an ephemeral one, so a client keeps its
 * backend across connections) and the service address; else a uniformly
 * random slot among the `count` active slots.
 *
 * Refusal: a service with no active backend (count 0, the wildcard entry, a
 * slot or backend missing during an update) makes connect()/sendmsg() fail
 * with ECONNREFUSED, as a client of a kube-proxy REJECT rule sees it: the
 * program sets the error with bpf_set_retval() and returns the cgroup deny
 * verdict (without bpf_set_retval the kernel would report EPERM).
 *
 * IPv4-mapped destinations (::ffff:a.b.c.d) of dual-stack IPv6 sockets are
 * balanced over the IPv4 service, with mapped backend addresses.
 *
 * Egress policy (include/policy.h): a socket whose network namespace is an
 * endpoint's (policy_netns, keyed by bpf_get_netns_cookie) and whose endpoint
 * enforces egress may only connect or send to what that endpoint's policy map
 * (policy_maps[endpoint id], Cilium's cilium_policy_v2 layout) allows. The
 * check runs after service translation, on the selected backend's address
 * and port: the destination's identity comes from the ipcache (longest
 * prefix; world when absent), then Cilium's two lookups (the identity, then
 * any identity), a deny entry winning. Refused with EPERM (the cgroup deny
 * verdict without a retval). Loopback destinations stay inside the pod's own
 * namespace and are always allowed. TCP, UDP and SCTP sockets are checked;
 * other protocols (ICMP sockets) are not. Sockets of namespaces that are no
 * endpoint's, or whose endpoint does not enforce egress, see no difference.
 *
 * Not handled here: source ranges (not checked at the socket), L7 proxy
 * redirection, ingress policy.
 */
#define SW_DEFINE_MAPS
#include <stdbool.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "include/lb.h"
#include "include/lb_select.h"
#include "include/sock_lb.h"
#include "include/ipcache.h"
#include "include/policy.h"
#include "include/events.h"

#define SW_IPPROTO_TCP 6
#define SW_IPPROTO_UDP 17
#define SW_IPPROTO_SCTP 132
#define SW_IDENTITY_WORLD 2
#define SW_ECONNREFUSED 111

/* cgroup sock_addr verdicts. */
#define SW_SYS_REJECT 0
#define SW_SYS_PROCEED 1

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct sw_sock_revnat4_key);
	__type(value, struct sw_sock_revnat4_val);
	__uint(max_entries, SW_SOCK_REVNAT_MAX_ENTRIES);
} lb4_sock_revnat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct sw_sock_revnat6_key);
	__type(value, struct sw_sock_revnat6_val);
	__uint(max_entries, SW_SOCK_REVNAT_MAX_ENTRIES);
} lb6_sock_revnat SEC(".maps");

/* The reject verdict with ECONNREFUSED as the syscall's error. */
static __always_inline int sw_refuse(void)
{
	bpf_set_retval(-SW_ECONNREFUSED);
	return SW_SYS_REJECT;
}

/* ---------------------------------------------------------------- policy */

static __always_inline bool sw_policy_proto(__u32 proto)
{
	return proto == SW_IPPROTO_TCP || proto == SW_IPPROTO_UDP || proto == SW_IPPROTO_SCTP;
}

/* The endpoint whose namespace ctx's socket lives in, when it enforces egress
 * policy; 0 otherwise (no endpoint's namespace, or egress not enforced). */
static __always_inline __u32 sw_policy_egress_endpoint(struct bpf_sock_addr *ctx)
{
	__u64 cookie = bpf_get_netns_cookie(ctx);
	struct policy_netns *pn;

	pn = bpf_map_lookup_elem(&policy_netns, &cookie);
	if (!pn || !(pn->flags & SW_POLICY_NETNS_F_EGRESS))
		return 0;
	return pn->endpoint_id;
}

/* Whether endpoint `ep`'s policy allows egress to identity `remote` on
 * proto/dport: Cilium's lookups, the identity's entry first, then the entry
 * for any identity; a deny in either wins, no entry at all denies. An
 * endpoint without a policy map allows nothing. */
static __always_inline bool sw_policy_allows(__u32 ep, __u32 remote, __u8 proto, __be16 dport,
					     __u8 *lpm)
{
	struct policy_key key = {
		.prefixlen = SW_POLICY_FULL_PREFIX,
		.sec_label = remote,
		.egress = 1,
		.protocol = proto,
		.dport = dport,
	};
	struct policy_entry *l3, *l4;
	void *map;

	*lpm = SW_EVENT_NO_LPM;
	map = bpf_map_lookup_elem(&policy_maps, &ep);
	if (!map)
		return false;
	l3 = bpf_map_lookup_elem(map, &key);
	if (l3 && (l3->flags & SW_POLICY_F_DENY)) {
		*lpm = l3->flags >> SW_POLICY_LPM_SHIFT;
		return false;
	}
	key.sec_label = 0;
	l4 = bpf_map_lookup_elem(map, &key);
	if (l4) {
		*lpm = l4->flags >> SW_POLICY_LPM_SHIFT;
		return !(l4->flags & SW_POLICY_F_DENY);
	}
	if (l3)
		*lpm = l3->flags >> SW_POLICY_LPM_SHIFT;
	return l3 != NULL;
}

static __always_inline __u32 sw_identity4(__be32 addr)
{
	struct ipcache_key key = {
		.prefixlen = 32 + 32,
		.family = SW_FAMILY_IPV4,
	};
	struct remote_endpoint_info *info;

	key.ip4 = addr;
	info = bpf_map_lookup_elem(&ipcache, &key);
	return info ? info->sec_identity : SW_IDENTITY_WORLD;
}

static __always_inline __u32 sw_identity6(const union sw_v6addr *addr)
{
	struct ipcache_key key = {
		.prefixlen = 32 + 128,
		.family = SW_FAMILY_IPV6,
	};
	struct remote_endpoint_info *info;

	key.ip6 = *addr;
	info = bpf_map_lookup_elem(&ipcache, &key);
	return info ? info->sec_identity : SW_IDENTITY_WORLD;
}

/* The fields of a socket event both families share: the socket's endpoint
 * (its identity the reader looks up), the destination's identity and port
 * after translation, the frontend's port. */
static __always_inline void sw_sock_event_head(struct sw_event *ev, struct bpf_sock_addr *ctx,
					       __u8 type, int reason, __u32 ep, __u32 dst_id,
					       __u8 lpm, __be16 fe_port)
{
	ev->type = type;
	ev->verdict = reason ? SW_EVENT_VERDICT_DROPPED : SW_EVENT_VERDICT_FORWARDED;
	ev->reason = (__u8)reason;
	ev->dir = 2;  /* egress: the socket's endpoint connects out */
	ev->proto = (__u8)ctx->protocol;
	ev->lpm = lpm;
	ev->source = SW_EVENT_SRC_SOCK;
	ev->dst_identity = dst_id;
	ev->endpoint_id = (__u16)ep;
	ev->dport = (__be16)ctx->user_port;
	ev->orig_dport = fe_port;
}

/* A connect's or datagram's event: the destination after translation and, for
 * a translation or a refusal, the frontend. */
static __always_inline void sw_sock_event4(struct bpf_sock_addr *ctx, __u8 type, int reason,
					   __u32 ep, __u32 dst_id, __u8 lpm, __be32 fe_addr,
					   __be16 fe_port)
{
	struct sw_event ev = {};
	__be32 daddr = ctx->user_ip4;

	sw_sock_event_head(&ev, ctx, type, reason, ep, dst_id, lpm, fe_port);
	ev.family = 4;
	__builtin_memcpy(ev.daddr, &daddr, 4);
	__builtin_memcpy(ev.orig_daddr, &fe_addr, 4);
	sw_event_emit(&ev);
}

/* The endpoint of ctx's namespace (0: none): reported with a translation. */
static __always_inline __u32 sw_sock_endpoint(struct bpf_sock_addr *ctx)
{
	__u64 cookie = bpf_get_netns_cookie(ctx);
	struct policy_netns *pn = bpf_map_lookup_elem(&policy_netns, &cookie);

	return pn ? pn->endpoint_id : 0;
}

/* What a policy check reports: nothing, a denial only (a datagram of an
 * unconnected socket: each one is checked, the allowed ones are not news), or
 * the verdict either way (a connect: a new flow). */
#define SW_REPORT_NONE 0
#define SW_REPORT_DROPS 1
#define SW_REPORT_ALL 2

/* Cilium's drop reason for a service without a backend to offer (the
 * connect or sendmsg is refused). */
#define SW_DROP_SERVICE_BACKEND_NOT_FOUND 158

/* Whether the egress policy of ctx's endpoint allows its (translated) IPv4
 * destination; `report` says which verdicts are emitted (SW_REPORT_*). */
static __always_inline bool sw_policy_egress4(struct bpf_sock_addr *ctx, __u32 proto, __u8 report)
{
	__be32 daddr;
	__u32 ep, dst;
	__u8 lpm;
	bool ok;

	if (!sw_policy_proto(proto))
		return true;
	ep = sw_policy_egress_endpoint(ctx);
	if (!ep)
		return true;
	daddr = ctx->user_ip4;
	if ((bpf_ntohl(daddr) >> 24) == 127)
		return true;
	dst = sw_identity4(daddr);
	ok = sw_policy_allows(ep, dst, proto, (__be16)ctx->user_port, &lpm);
	if (report == SW_REPORT_ALL || (report == SW_REPORT_DROPS && !ok))
		/* Denied by a deny entry (POLICY_DENY), or by no entry (POLICY_DENIED). */
		sw_sock_event4(ctx, ok ? SW_EVENT_POLICY : SW_EVENT_DROP,
			       ok ? 0 : (lpm == SW_EVENT_NO_LPM ? SW_DROP_POLICY_DENIED
							 : SW_DROP_POLICY_DENY),
			       ep, dst, lpm, 0, 0);
	return ok;
}

/* ------------------------------------------------------------------ IPv4 */

/* The frontend entry for the destination in `key` (address and dport set);
 * on return `key` is the key that matched, so its slots can be read. */
static __always_inline struct lb4_service *sw_lookup4(struct lb4_key *key, __u8 proto)
{
	struct lb4_service *svc, *internal;
	__be32 address = key->address;

	key->backend_slot = 0;
	key->scope = SW_SCOPE_EXTERNAL;
	key->proto = proto;
	svc = bpf_map_lookup_elem(&lb4_services, key);
	if (!svc) {
		key->proto = 0;
		svc = bpf_map_lookup_elem(&lb4_services, key);
	}
	if (!svc && (bpf_ntohl(address) >> 24) == 127) {
		key->address = 0;
		key->proto = proto;
		svc = bpf_map_lookup_elem(&lb4_services, key);
		if (svc && !(svc->flags & (SW_SVC_F_NODE_PORT | SW_SVC_F_HOST_PORT)))
			svc = NULL;
		if (!svc)
			key->address = address;
	}
	if (svc && (svc->flags2 & SW_SVC_F2_TWO_SCOPES)) {
		key->scope = SW_SCOPE_INTERNAL;
		internal = bpf_map_lookup_elem(&lb4_services, key);
		if (internal)
			return internal;
		key->scope = SW_SCOPE_EXTERNAL;
	}
	if (!svc) {
		key->dport = 0;
		key->proto = 0;
		svc = bpf_map_lookup_elem(&lb4_services, key);
	}
	return svc;
}

static __always_inline __u32 sw_slot_backend4(struct lb4_key *key, __u16 slot)
{
	struct lb4_service *s;

	key->backend_slot = slot;
	s = bpf_map_lookup_elem(&lb4_services, key);
	return s ? s->backend_id : 0;
}

static __always_inline __u32 sw_hash4(struct bpf_sock_addr *ctx, __u64 netns, __be32 daddr,
				      __be16 dport)
{
	struct bpf_sock *sk = ctx->sk;
	__u32 h = 0x5357; /* arbitrary seed */

	h = sw_hash_mix(h, (__u32)netns);
	h = sw_hash_mix(h, (__u32)(netns >> 32));
	if (sk) {
		h = sw_hash_mix(h, sk->src_ip4);
	}
	h = sw_hash_mix(h, daddr);
	h = sw_hash_mix(h, dport);
	return sw_hash_final(h);
}

/* The backend id for a connection to the service `svc` (master copy), or 0. */
static __always_inline __u32 sw_select4(struct bpf_sock_addr *ctx, struct lb4_key *key,
					const struct lb4_service *svc, __be32 daddr, __be16 dport)
{
	struct lb4_affinity_key akey = {};
	struct lb_affinity_match match = {};
	struct lb_affinity_val aval = {};
	struct lb_affinity_val *cur;
	__u32 alg = svc->backend_id >> SW_LB_ALG_SHIFT;
	__u32 timeout = svc->affinity_timeout & SW_AFFINITY_TIMEOUT_MASK;
	bool affinity = svc->flags & SW_SVC_F_AFFINITY;
	__u64 netns = bpf_get_netns_cookie(ctx);
	__u64 now = sw_now_sec();
	__u32 backend_id = 0;

	if (affinity) {
		akey.client_id.client_cookie = netns;
		akey.rev_nat_id = bpf_ntohs(svc->rev_nat_index);
		akey.netns_cookie = 1;
		cur = bpf_map_lookup_elem(&lb4_affinity, &akey);
		if (cur) {
			match.backend_id = cur->backend_id;
			match.rev_nat_id = svc->rev_nat_index;
			if (cur->last_used + timeout > now &&
			    bpf_map_lookup_elem(&lb_affinity_match, &match) &&
			    bpf_map_lookup_elem(&lb4_backends, &match.backend_id)) {
				cur->last_used = now;
				return match.backend_id;
			}
			bpf_map_delete_elem(&lb4_affinity, &akey);
		}
	}
	if (alg != SW_LB_ALG_RANDOM)
		backend_id = sw_maglev_backend(&lb4_maglev, svc->rev_nat_index,
					       sw_hash4(ctx, netns, daddr, dport));
	if (!backend_id)
		backend_id = sw_slot_backend4(key, bpf_get_prandom_u32() % svc->count + 1);
	if (affinity && backend_id) {
		aval.last_used = now;
		aval.backend_id = backend_id;
		bpf_map_update_elem(&lb4_affinity, &akey, &aval, BPF_ANY);
	}
	return backend_id;
}

/* The backend for a socket of ctx going to daddr:dport: 1 with *out set when
 * the destination is a service with a backend, 0 when it is no service,
 * -ECONNREFUSED when the service has no backend to offer. Shared by the IPv4
 * hooks and the IPv6 hooks for IPv4-mapped destinations. */
static __always_inline int sw_fwd4(struct bpf_sock_addr *ctx, __u8 proto, __be32 daddr,
				   __be16 dport, struct lb4_backend *out, __be16 *rev_nat_index)
{
	struct lb4_key key = { .address = daddr, .dport = dport };
	struct lb4_service *found, svc;
	struct lb4_backend *be;
	__u32 backend_id;

	found = sw_lookup4(&key, proto);
	if (!found)
		return 0;
	svc = *found;
	if (svc.count == 0)
		return -SW_ECONNREFUSED;
	backend_id = sw_select4(ctx, &key, &svc, daddr, dport);
	if (!backend_id)
		return -SW_ECONNREFUSED;
	be = bpf_map_lookup_elem(&lb4_backends, &backend_id);
	if (!be)
		return -SW_ECONNREFUSED;
	*out = *be;
	*rev_nat_index = svc.rev_nat_index;
	return 1;
}

/* Remember the service a translated socket asked for (its replies are shown
 * from there): 2 when the entry is new or changed, 1 when it was there (the
 * socket sent to that backend before: not news for the monitor). */
static __always_inline int sw_sock_revnat4_put(struct sw_sock_revnat4_key *k,
					       struct sw_sock_revnat4_val *v)
{
	struct sw_sock_revnat4_val *old = bpf_map_lookup_elem(&lb4_sock_revnat, k);

	if (old && old->address == v->address && old->port == v->port &&
	    old->rev_nat_index == v->rev_nat_index)
		return 1;
	bpf_map_update_elem(&lb4_sock_revnat, k, v, BPF_ANY);
	return 2;
}

/* Translate the destination of ctx if it is a service: 2 when translated for
 * a new (socket, backend) pair, 1 when translated as before, 0 when not a
 * service, -ECONNREFUSED when the service has no backend to offer. */
static __always_inline int sw_xlate4(struct bpf_sock_addr *ctx, __u8 proto)
{
	__be32 daddr = ctx->user_ip4;
	__be16 dport = (__be16)ctx->user_port;
	struct sw_sock_revnat4_key rkey = {};
	struct sw_sock_revnat4_val rval = {};
	struct lb4_backend be;
	__be16 rev_nat_index;
	int ret;

	ret = sw_fwd4(ctx, proto, daddr, dport, &be, &rev_nat_index);
	if (ret <= 0)
		return ret;

	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.address = be.address;
	rkey.port = be.port;
	rval.address = daddr;
	rval.port = dport;
	rval.rev_nat_index = rev_nat_index;
	ret = sw_sock_revnat4_put(&rkey, &rval);

	ctx->user_ip4 = be.address;
	ctx->user_port = be.port;
	return ret;
}

/* Show the service address instead of the backend a translated socket talks to. */
static __always_inline void sw_rev_xlate4(struct bpf_sock_addr *ctx)
{
	struct sw_sock_revnat4_key rkey = {};
	struct sw_sock_revnat4_val *rval;
	__be16 rev_nat_index;

	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.address = ctx->user_ip4;
	rkey.port = (__be16)ctx->user_port;
	rval = bpf_map_lookup_elem(&lb4_sock_revnat, &rkey);
	if (!rval)
		return;
	rev_nat_index = rval->rev_nat_index;
	if (!bpf_map_lookup_elem(&lb4_reverse_nat, &rev_nat_index)) {
		/* The service is gone: the backend is all there is to show. */
		bpf_map_delete_elem(&lb4_sock_revnat, &rkey);
		return;
	}
	ctx->user_ip4 = rval->address;
	ctx->user_port = rval->port;
}

SEC("cgroup/connect4")
int sw_sock4_connect(struct bpf_sock_addr *ctx)
{
	__u32 proto = ctx->protocol;
	__be32 fe_addr = ctx->user_ip4;
	__be16 fe_port = (__be16)ctx->user_port;
	int ret;

	if (proto == SW_IPPROTO_TCP || proto == SW_IPPROTO_UDP) {
		ret = sw_xlate4(ctx, proto);
		if (ret < 0) {
			sw_sock_event4(ctx, SW_EVENT_DROP, SW_DROP_SERVICE_BACKEND_NOT_FOUND,
				       sw_sock_endpoint(ctx), 0, SW_EVENT_NO_LPM, fe_addr, fe_port);
			return sw_refuse();
		}
		if (ret > 0)
			sw_sock_event4(ctx, SW_EVENT_TRACE, 0, sw_sock_endpoint(ctx), 0,
				       SW_EVENT_NO_LPM, fe_addr, fe_port);
	}
	if (!sw_policy_egress4(ctx, proto, SW_REPORT_ALL))
		return SW_SYS_REJECT;
	return SW_SYS_PROCEED;
}

SEC("cgroup/sendmsg4")
int sw_sock4_sendmsg(struct bpf_sock_addr *ctx)
{
	__u32 proto = ctx->protocol;
	__be32 fe_addr = ctx->user_ip4;
	__be16 fe_port = (__be16)ctx->user_port;
	int ret;

	/* An unconnected socket's datagram: a translation is reported for the
	 * first datagram to each backend, a refusal or a denial for each one. */
	if (proto == SW_IPPROTO_UDP) {
		ret = sw_xlate4(ctx, SW_IPPROTO_UDP);
		if (ret < 0) {
			sw_sock_event4(ctx, SW_EVENT_DROP, SW_DROP_SERVICE_BACKEND_NOT_FOUND,
				       sw_sock_endpoint(ctx), 0, SW_EVENT_NO_LPM, fe_addr, fe_port);
			return sw_refuse();
		}
		if (ret == 2)
			sw_sock_event4(ctx, SW_EVENT_TRACE, 0, sw_sock_endpoint(ctx), 0,
				       SW_EVENT_NO_LPM, fe_addr, fe_port);
	}
	if (!sw_policy_egress4(ctx, proto, SW_REPORT_DROPS))
		return SW_SYS_REJECT;
	return SW_SYS_PROCEED;
}

SEC("cgroup/recvmsg4")
int sw_sock4_recvmsg(struct bpf_sock_addr *ctx)
{
	sw_rev_xlate4(ctx);
	return SW_SYS_PROCEED;
}

SEC("cgroup/getpeername4")
int sw_sock4_getpeername(struct bpf_sock_addr *ctx)
{
	sw_rev_xlate4(ctx);
	return SW_SYS_PROCEED;
}

/* ------------------------------------------------------------------ IPv6 */

static __always_inline void sw_ctx_ip6(const struct bpf_sock_addr *ctx, union sw_v6addr *a)
{
	a->p1 = ctx->user_ip6[0];
	a->p2 = ctx->user_ip6[1];
	a->p3 = ctx->user_ip6[2];
	a->p4 = ctx->user_ip6[3];
}

static __always_inline void sw_set_ctx_ip6(struct bpf_sock_addr *ctx, const union sw_v6addr *a)
{
	ctx->user_ip6[0] = a->p1;
	ctx->user_ip6[1] = a->p2;
	ctx->user_ip6[2] = a->p3;
	ctx->user_ip6[3] = a->p4;
}

static __always_inline bool sw_is_loopback6(const union sw_v6addr *a)
{
	return (a->p1 | a->p2 | a->p3) == 0 && a->p4 == bpf_htonl(1);
}

static __always_inline struct lb6_service *sw_lookup6(struct lb6_key *key, __u8 proto)
{
	struct lb6_service *svc, *internal;
	union sw_v6addr address = key->address;

	key->backend_slot = 0;
	key->scope = SW_SCOPE_EXTERNAL;
	key->proto = proto;
	svc = bpf_map_lookup_elem(&lb6_services, key);
	if (!svc) {
		key->proto = 0;
		svc = bpf_map_lookup_elem(&lb6_services, key);
	}
	if (!svc && sw_is_loopback6(&address)) {
		__builtin_memset(&key->address, 0, sizeof(key->address));
		key->proto = proto;
		svc = bpf_map_lookup_elem(&lb6_services, key);
		if (svc && !(svc->flags & (SW_SVC_F_NODE_PORT | SW_SVC_F_HOST_PORT)))
			svc = NULL;
		if (!svc)
			key->address = address;
	}
	if (svc && (svc->flags2 & SW_SVC_F2_TWO_SCOPES)) {
		key->scope = SW_SCOPE_INTERNAL;
		internal = bpf_map_lookup_elem(&lb6_services, key);
		if (internal)
			return internal;
		key->scope = SW_SCOPE_EXTERNAL;
	}
	if (!svc) {
		key->dport = 0;
		key->proto = 0;
		svc = bpf_map_lookup_elem(&lb6_services, key);
	}
	return svc;
}

static __always_inline __u32 sw_slot_backend6(struct lb6_key *key, __u16 slot)
{
	struct lb6_service *s;

	key->backend_slot = slot;
	s = bpf_map_lookup_elem(&lb6_services, key);
	return s ? s->backend_id : 0;
}

static __always_inline __u32 sw_hash6(struct bpf_sock_addr *ctx, __u64 netns,
				      const union sw_v6addr *daddr, __be16 dport)
{
	struct bpf_sock *sk = ctx->sk;
	__u32 h = 0x5357;

	h = sw_hash_mix(h, (__u32)netns);
	h = sw_hash_mix(h, (__u32)(netns >> 32));
	if (sk) {
		h = sw_hash_mix(h, sk->src_ip6[0]);
		h = sw_hash_mix(h, sk->src_ip6[1]);
		h = sw_hash_mix(h, sk->src_ip6[2]);
		h = sw_hash_mix(h, sk->src_ip6[3]);
	}
	h = sw_hash_mix(h, daddr->p1);
	h = sw_hash_mix(h, daddr->p2);
	h = sw_hash_mix(h, daddr->p3);
	h = sw_hash_mix(h, daddr->p4);
	h = sw_hash_mix(h, dport);
	return sw_hash_final(h);
}

static __always_inline __u32 sw_select6(struct bpf_sock_addr *ctx, struct lb6_key *key,
					const struct lb6_service *svc,
					const union sw_v6addr *daddr, __be16 dport)
{
	struct lb6_affinity_key akey = {};
	struct lb_affinity_match match = {};
	struct lb_affinity_val aval = {};
	struct lb_affinity_val *cur;
	__u32 alg = svc->backend_id >> SW_LB_ALG_SHIFT;
	__u32 timeout = svc->affinity_timeout & SW_AFFINITY_TIMEOUT_MASK;
	bool affinity = svc->flags & SW_SVC_F_AFFINITY;
	__u64 netns = bpf_get_netns_cookie(ctx);
	__u64 now = sw_now_sec();
	__u32 backend_id = 0;

	if (affinity) {
		akey.client_id.client_cookie = netns;
		akey.rev_nat_id = bpf_ntohs(svc->rev_nat_index);
		akey.netns_cookie = 1;
		cur = bpf_map_lookup_elem(&lb6_affinity, &akey);
		if (cur) {
			match.backend_id = cur->backend_id;
			match.rev_nat_id = svc->rev_nat_index;
			if (cur->last_used + timeout > now &&
			    bpf_map_lookup_elem(&lb_affinity_match, &match) &&
			    bpf_map_lookup_elem(&lb6_backends, &match.backend_id)) {
				cur->last_used = now;
				return match.backend_id;
			}
			bpf_map_delete_elem(&lb6_affinity, &akey);
		}
	}
	if (alg != SW_LB_ALG_RANDOM)
		backend_id = sw_maglev_backend(&lb6_maglev, svc->rev_nat_index,
					       sw_hash6(ctx, netns, daddr, dport));
	if (!backend_id)
		backend_id = sw_slot_backend6(key, bpf_get_prandom_u32() % svc->count + 1);
	if (affinity && backend_id) {
		aval.last_used = now;
		aval.backend_id = backend_id;
		bpf_map_update_elem(&lb6_affinity, &akey, &aval, BPF_ANY);
	}
	return backend_id;
}

static __always_inline bool sw_is_v4mapped(const union sw_v6addr *a)
{
	return a->p1 == 0 && a->p2 == 0 && a->p3 == bpf_htonl(0xffff);
}

/* An IPv4-mapped destination (::ffff:a.b.c.d) of a dual-stack IPv6 socket goes
 * to the IPv4 service. Its reverse entry is an IPv4 one in lb4_sock_revnat:
 * the kernel runs sendmsg4 (not sendmsg6) for such datagrams, so replies of
 * unconnected and connected sockets alike are found there. */
static __always_inline int sw_xlate6_v4mapped(struct bpf_sock_addr *ctx, __u8 proto,
					      const union sw_v6addr *daddr, __be16 dport)
{
	struct sw_sock_revnat4_key rkey = {};
	struct sw_sock_revnat4_val rval = {};
	struct lb4_backend be;
	union sw_v6addr mapped;
	__be16 rev_nat_index;
	int ret;

	ret = sw_fwd4(ctx, proto, daddr->p4, dport, &be, &rev_nat_index);
	if (ret <= 0)
		return ret;

	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.address = be.address;
	rkey.port = be.port;
	rval.address = daddr->p4;
	rval.port = dport;
	rval.rev_nat_index = rev_nat_index;
	ret = sw_sock_revnat4_put(&rkey, &rval);

	mapped.p1 = 0;
	mapped.p2 = 0;
	mapped.p3 = bpf_htonl(0xffff);
	mapped.p4 = be.address;
	sw_set_ctx_ip6(ctx, &mapped);
	ctx->user_port = be.port;
	return ret;
}

/* Reverse translation of an IPv4-mapped peer through lb4_sock_revnat. */
static __always_inline void sw_rev_xlate6_v4mapped(struct bpf_sock_addr *ctx,
						   const union sw_v6addr *peer)
{
	struct sw_sock_revnat4_key rkey = {};
	struct sw_sock_revnat4_val *rval;
	union sw_v6addr mapped;
	__be16 rev_nat_index;

	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.address = peer->p4;
	rkey.port = (__be16)ctx->user_port;
	rval = bpf_map_lookup_elem(&lb4_sock_revnat, &rkey);
	if (!rval)
		return;
	rev_nat_index = rval->rev_nat_index;
	if (!bpf_map_lookup_elem(&lb4_reverse_nat, &rev_nat_index)) {
		bpf_map_delete_elem(&lb4_sock_revnat, &rkey);
		return;
	}
	mapped.p1 = 0;
	mapped.p2 = 0;
	mapped.p3 = bpf_htonl(0xffff);
	mapped.p4 = rval->address;
	sw_set_ctx_ip6(ctx, &mapped);
	ctx->user_port = rval->port;
}

/* sw_sock_revnat4_put's IPv6 twin. */
static __always_inline int sw_sock_revnat6_put(struct sw_sock_revnat6_key *k,
					       struct sw_sock_revnat6_val *v)
{
	struct sw_sock_revnat6_val *old = bpf_map_lookup_elem(&lb6_sock_revnat, k);

	if (old && old->address.p1 == v->address.p1 && old->address.p2 == v->address.p2 &&
	    old->address.p3 == v->address.p3 && old->address.p4 == v->address.p4 &&
	    old->port == v->port && old->rev_nat_index == v->rev_nat_index)
		return 1;
	bpf_map_update_elem(&lb6_sock_revnat, k, v, BPF_ANY);
	return 2;
}

/* sw_xlate4 for an IPv6 socket (an IPv4-mapped destination: the IPv4
 * service); the same return values. */
static __always_inline int sw_xlate6(struct bpf_sock_addr *ctx, __u8 proto)
{
	__be16 dport = (__be16)ctx->user_port;
	struct lb6_key key = { .dport = dport };
	struct sw_sock_revnat6_key rkey = {};
	struct sw_sock_revnat6_val rval = {};
	struct lb6_service *found, svc;
	struct lb6_backend *be;
	union sw_v6addr daddr;
	__u32 backend_id;
	int ret;

	sw_ctx_ip6(ctx, &daddr);
	if (sw_is_v4mapped(&daddr))
		return sw_xlate6_v4mapped(ctx, proto, &daddr, dport);
	key.address = daddr;
	found = sw_lookup6(&key, proto);
	if (!found)
		return 0;
	svc = *found;
	if (svc.count == 0)
		return -SW_ECONNREFUSED;
	backend_id = sw_select6(ctx, &key, &svc, &daddr, dport);
	if (!backend_id)
		return -SW_ECONNREFUSED;
	be = bpf_map_lookup_elem(&lb6_backends, &backend_id);
	if (!be)
		return -SW_ECONNREFUSED;

	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.address = be->address;
	rkey.port = be->port;
	rval.address = daddr;
	rval.port = dport;
	rval.rev_nat_index = svc.rev_nat_index;
	ret = sw_sock_revnat6_put(&rkey, &rval);

	sw_set_ctx_ip6(ctx, &be->address);
	ctx->user_port = be->port;
	return ret;
}

static __always_inline void sw_rev_xlate6(struct bpf_sock_addr *ctx)
{
	struct sw_sock_revnat6_key rkey = {};
	struct sw_sock_revnat6_val *rval;
	__be16 rev_nat_index;

	sw_ctx_ip6(ctx, &rkey.address);
	if (sw_is_v4mapped(&rkey.address)) {
		sw_rev_xlate6_v4mapped(ctx, &rkey.address);
		return;
	}
	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.port = (__be16)ctx->user_port;
	rval = bpf_map_lookup_elem(&lb6_sock_revnat, &rkey);
	if (!rval)
		return;
	rev_nat_index = rval->rev_nat_index;
	if (!bpf_map_lookup_elem(&lb6_reverse_nat, &rev_nat_index)) {
		bpf_map_delete_elem(&lb6_sock_revnat, &rkey);
		return;
	}
	sw_set_ctx_ip6(ctx, &rval->address);
	ctx->user_port = rval->port;
}

/* sw_sock_event4 for an IPv6 socket; an IPv4-mapped destination is reported
 * as the IPv4 address it is. `fe` is the frontend (NULL: none). */
static __always_inline void sw_sock_event6(struct bpf_sock_addr *ctx, __u8 type, int reason,
					   __u32 ep, __u32 dst_id, __u8 lpm,
					   const union sw_v6addr *fe, __be16 fe_port)
{
	struct sw_event ev = {};
	union sw_v6addr daddr;

	sw_ctx_ip6(ctx, &daddr);
	sw_sock_event_head(&ev, ctx, type, reason, ep, dst_id, lpm, fe_port);
	if (sw_is_v4mapped(&daddr)) {
		ev.family = 4;
		__builtin_memcpy(ev.daddr, &daddr.p4, 4);
		if (fe)
			__builtin_memcpy(ev.orig_daddr, &fe->p4, 4);
	} else {
		ev.family = 6;
		__builtin_memcpy(ev.daddr, &daddr, 16);
		if (fe)
			__builtin_memcpy(ev.orig_daddr, fe, 16);
	}
	sw_event_emit(&ev);
}

/* Whether the egress policy of ctx's endpoint allows its (translated) IPv6
 * destination; an IPv4-mapped one is judged by its IPv4 address. `report` as
 * for sw_policy_egress4. */
static __always_inline bool sw_policy_egress6(struct bpf_sock_addr *ctx, __u32 proto, __u8 report)
{
	union sw_v6addr daddr;
	__u32 ep, remote;
	__u8 lpm;
	bool ok;

	if (!sw_policy_proto(proto))
		return true;
	ep = sw_policy_egress_endpoint(ctx);
	if (!ep)
		return true;
	sw_ctx_ip6(ctx, &daddr);
	if (sw_is_loopback6(&daddr))
		return true;
	if (sw_is_v4mapped(&daddr)) {
		if ((bpf_ntohl(daddr.p4) >> 24) == 127)
			return true;
		remote = sw_identity4(daddr.p4);
	} else {
		remote = sw_identity6(&daddr);
	}
	ok = sw_policy_allows(ep, remote, proto, (__be16)ctx->user_port, &lpm);
	if (report == SW_REPORT_ALL || (report == SW_REPORT_DROPS && !ok))
		sw_sock_event6(ctx, ok ? SW_EVENT_POLICY : SW_EVENT_DROP,
			       ok ? 0 : (lpm == SW_EVENT_NO_LPM ? SW_DROP_POLICY_DENIED
							 : SW_DROP_POLICY_DENY),
			       ep, remote, lpm, NULL, 0);
	return ok;
}

/* The events of an IPv6 socket's connect (`datagram` false) or unconnected
 * datagram (true), as for IPv4: a refusal, a translation (for a datagram, the
 * first one to each backend), the policy verdict. */
static __always_inline int sw_sock6_xlate_report(struct bpf_sock_addr *ctx, __u32 proto,
						 bool datagram)
{
	__be16 fe_port = (__be16)ctx->user_port;
	union sw_v6addr fe;
	int ret;

	sw_ctx_ip6(ctx, &fe);
	ret = sw_xlate6(ctx, proto);
	if (ret < 0) {
		sw_sock_event6(ctx, SW_EVENT_DROP, SW_DROP_SERVICE_BACKEND_NOT_FOUND,
			       sw_sock_endpoint(ctx), 0, SW_EVENT_NO_LPM, &fe, fe_port);
		return sw_refuse();
	}
	if (ret == 2 || (ret > 0 && !datagram))
		sw_sock_event6(ctx, SW_EVENT_TRACE, 0, sw_sock_endpoint(ctx), 0,
			       SW_EVENT_NO_LPM, &fe, fe_port);
	return SW_SYS_PROCEED;
}

SEC("cgroup/connect6")
int sw_sock6_connect(struct bpf_sock_addr *ctx)
{
	__u32 proto = ctx->protocol;

	if (proto == SW_IPPROTO_TCP || proto == SW_IPPROTO_UDP) {
		if (sw_sock6_xlate_report(ctx, proto, false) != SW_SYS_PROCEED)
			return SW_SYS_REJECT;
	}
	if (!sw_policy_egress6(ctx, proto, SW_REPORT_ALL))
		return SW_SYS_REJECT;
	return SW_SYS_PROCEED;
}

SEC("cgroup/sendmsg6")
int sw_sock6_sendmsg(struct bpf_sock_addr *ctx)
{
	__u32 proto = ctx->protocol;

	if (proto == SW_IPPROTO_UDP) {
		if (sw_sock6_xlate_report(ctx, SW_IPPROTO_UDP, true) != SW_SYS_PROCEED)
			return SW_SYS_REJECT;
	}
	if (!sw_policy_egress6(ctx, proto, SW_REPORT_DROPS))
		return SW_SYS_REJECT;
	return SW_SYS_PROCEED;
}

SEC("cgroup/recvmsg6")
int sw_sock6_recvmsg(struct bpf_sock_addr *ctx)
{
	sw_rev_xlate6(ctx);
	return SW_SYS_PROCEED;
}

SEC("cgroup/getpeername6")
int sw_sock6_getpeername(struct bpf_sock_addr *ctx)
{
	sw_rev_xlate6(ctx);
	return SW_SYS_PROCEED;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
