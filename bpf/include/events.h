/* SPDX-License-Identifier: Apache-2.0 */
/* Statewright: datapath events for `statewright monitor` (docs/observability.md).
 *
 * A program fills a struct sw_event and calls sw_event_emit(): drops (reason,
 * direction, tuple, identities), policy verdicts of new flows (allowed or
 * denied, the lpm_prefix_length of the entry that decided) and service
 * translations (frontend, chosen backend). Events go into the `sw_events`
 * ring buffer, which the agent's monitor component reads.
 *
 * Nothing is emitted unless `sw_events_config` says so (the agent pins it
 * with `enabled` set; a program loaded without the agent's pins has its own
 * zeroed copy and emits nothing). A per-CPU token bucket (`sw_events_limit`:
 * `rate` events per second, bursts of `burst`) bounds what a flood can cost;
 * events refused by it or by a full ring are counted per CPU in
 * `sw_events_lost` (0: rate limit, 1: ring full).
 *
 * Emit only for what is new (a drop, a new flow's verdict, a connect's
 * translation): established flows cost nothing here. A program short of
 * stack reserves the event in the ring instead (sw_event_reserve/submit). Include after defining
 * SW_DEFINE_MAPS in exactly the programs that own the maps' definitions. */
#ifndef STATEWRIGHT_EVENTS_H
#define STATEWRIGHT_EVENTS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "common.h"

#define SW_EVENT_DROP 1
#define SW_EVENT_POLICY 2
#define SW_EVENT_TRACE 3

#define SW_EVENT_VERDICT_FORWARDED 1
#define SW_EVENT_VERDICT_DROPPED 2

/* Where an event was seen. */
#define SW_EVENT_SRC_LXC 1
#define SW_EVENT_SRC_SOCK 2
#define SW_EVENT_SRC_NODEPORT 3

/* lpm_prefix_length when no policy entry decided. */
#define SW_EVENT_NO_LPM 0xff

#define SW_EVENTS_RING_SIZE (256 * 1024)

/* Cilium's drop reason of a deny entry (also in ct.h, for the tc programs). */
#ifndef SW_DROP_POLICY_DENY
#define SW_DROP_POLICY_DENY 181
#endif
#define SW_DROP_POLICY_DENIED 133

#define SW_EVENTS_LOST_RATE 0
#define SW_EVENTS_LOST_FULL 1

/* 80 bytes; the layout bpf/events.py decodes. Addresses are 16 bytes, IPv4 in
 * the first four; ports in network order. */
struct sw_event {
	__u64 ts_ns;          /* bpf_ktime_get_ns() */
	__u8 type;            /* SW_EVENT_* */
	__u8 verdict;         /* SW_EVENT_VERDICT_* */
	__u8 reason;          /* drop reason (Cilium's codes), 0 otherwise */
	__u8 dir;             /* 1 ingress (to the endpoint), 2 egress (from it) */
	__u8 family;          /* 4 or 6 */
	__u8 proto;
	__u8 lpm;             /* lpm_prefix_length of the deciding entry, or NO_LPM */
	__u8 source;          /* SW_EVENT_SRC_* */
	__u32 src_identity;   /* 0: unknown (the reader looks it up) */
	__u32 dst_identity;
	__u16 endpoint_id;    /* the local endpoint concerned, 0 when none */
	__be16 sport;
	__be16 dport;
	__be16 orig_dport;    /* trace: the frontend's port */
	__u8 saddr[16];
	__u8 daddr[16];       /* trace: the chosen backend */
	__u8 orig_daddr[16];  /* trace: the frontend */
};

struct sw_events_config {
	__u32 enabled;
	__u32 rate;   /* events per second per CPU */
	__u32 burst;  /* bucket size */
	__u32 pad;
};

struct sw_events_bucket {
	__u64 last_ns;
	__u64 tokens_milli;  /* tokens x 1000 */
};

#ifdef SW_DEFINE_MAPS
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, SW_EVENTS_RING_SIZE);
} sw_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct sw_events_config);
	__uint(max_entries, 1);
} sw_events_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct sw_events_bucket);
	__uint(max_entries, 1);
} sw_events_limit SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 2);
} sw_events_lost SEC(".maps");
#endif

static __always_inline void sw_events_count_lost(__u32 cause)
{
	__u64 *n = bpf_map_lookup_elem(&sw_events_lost, &cause);

	if (n)
		*n += 1;  /* per CPU: no other writer */
}

/* Whether an event may be emitted now: enabled, and a token in this CPU's
 * bucket (refills at `rate` per second up to `burst`). */
static __always_inline bool sw_events_allowed(void)
{
	__u32 zero = 0;
	struct sw_events_config *cfg = bpf_map_lookup_elem(&sw_events_config, &zero);
	struct sw_events_bucket *b;
	__u64 now, add, cap;

	if (!cfg || !cfg->enabled)
		return false;
	b = bpf_map_lookup_elem(&sw_events_limit, &zero);
	if (!b)
		return false;
	now = bpf_ktime_get_ns();
	cap = (__u64)cfg->burst * 1000;
	/* rate events/s = rate/1e6 per ms: tokens_milli gain rate * elapsed_ns / 1e6 */
	add = (now - b->last_ns) / 1000000 * cfg->rate;
	if (add) {
		b->tokens_milli += add;
		b->last_ns = now;
	}
	if (b->tokens_milli > cap)
		b->tokens_milli = cap;
	if (b->tokens_milli < 1000) {
		sw_events_count_lost(SW_EVENTS_LOST_RATE);
		return false;
	}
	b->tokens_milli -= 1000;
	return true;
}

/* Emit `ev` (ts_ns is set here) when the configuration and the rate limit allow. */
static __always_inline void sw_event_emit(struct sw_event *ev)
{
	if (!sw_events_allowed())
		return;
	ev->ts_ns = bpf_ktime_get_ns();
	if (bpf_ringbuf_output(&sw_events, ev, sizeof(*ev), 0))
		sw_events_count_lost(SW_EVENTS_LOST_FULL);
}

/* The ring's room for one event, zeroed, when the configuration and the rate
 * limit allow (NULL otherwise): for programs whose stack has no room for a
 * struct sw_event. Fill it, then sw_event_submit() it. */
static __always_inline struct sw_event *sw_event_reserve(void)
{
	struct sw_event *ev;

	if (!sw_events_allowed())
		return NULL;
	ev = bpf_ringbuf_reserve(&sw_events, sizeof(*ev), 0);
	if (!ev) {
		sw_events_count_lost(SW_EVENTS_LOST_FULL);
		return NULL;
	}
	__builtin_memset(ev, 0, sizeof(*ev));
	return ev;
}

/* Submit an event of sw_event_reserve() (ts_ns is set here). */
static __always_inline void sw_event_submit(struct sw_event *ev)
{
	ev->ts_ns = bpf_ktime_get_ns();
	bpf_ringbuf_submit(ev, 0);
}

#endif /* STATEWRIGHT_EVENTS_H */
