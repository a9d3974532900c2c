/* SPDX-License-Identifier: Apache-2.0 */
/* Statewright: what the load-balancing programs share (bpf/sock_lb.c at the socket,
 * bpf/nodeport.c on the node's devices): the mixing hash that spreads clients over a
 * maglev table, the maglev lookup and the table size the loader sets. Each program
 * keeps its own notion of the client (a network namespace, an address). */
#ifndef STATEWRIGHT_LB_SELECT_H
#define STATEWRIGHT_LB_SELECT_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "lb.h"

/* Service flag bits (flags | flags2 << 8), as bpfops/flags.py writes them. */
#define SW_SVC_F_EXTERNAL_IPS (1 << 0)
#define SW_SVC_F_NODE_PORT (1 << 1)
#define SW_SVC_F_HOST_PORT (1 << 3)
#define SW_SVC_F_AFFINITY (1 << 4)
#define SW_SVC_F_LOAD_BALANCER (1 << 5)
#define SW_SVC_F_SOURCE_RANGE (1 << 7)
#define SW_SVC_F2_TWO_SCOPES (1 << (13 - 8))
#define SW_SVC_F2_SOURCE_RANGE_DENY (1 << (14 - 8))

/* The master slot's first word: algorithm in the top 8 bits, affinity timeout
 * (seconds) in the low 24 bits. */
#define SW_LB_ALG_SHIFT 24
#define SW_LB_ALG_RANDOM 1
#define SW_LB_ALG_MAGLEV 2
#define SW_AFFINITY_TIMEOUT_MASK ((1U << SW_LB_ALG_SHIFT) - 1)

#define SW_SCOPE_EXTERNAL 0
#define SW_SCOPE_INTERNAL 1

/* Entries of the maglev tables: the agent's configured size, set by the
 * loader before the program is loaded. The .rodata map is frozen, so the
 * verifier knows the value and checks every table access against the inner
 * map's real size. */
const volatile __u32 sw_maglev_table_size SEC(".rodata.maglev") = SW_LB_MAGLEV_TABLE_SIZE;

/* Keeps the compiler from reasoning about a value, so that the bounds check
 * that follows stays in the program for the verifier to see. */
#define sw_barrier_var(v) asm volatile("" : "+r"(v))

static __always_inline __u64 sw_now_sec(void)
{
	/* CLOCK_MONOTONIC, the clock of lb_affinity_val.last_used. */
	return bpf_ktime_get_ns() / 1000000000ULL;
}

/* A small multiplicative mixing hash (murmur3's block and finaliser steps):
 * only needs to spread clients over the maglev table, not resist attackers. */
static __always_inline __u32 sw_hash_mix(__u32 h, __u32 k)
{
	k *= 0xcc9e2d51;
	k = (k << 15) | (k >> 17);
	k *= 0x1b873593;
	h ^= k;
	h = (h << 13) | (h >> 19);
	return h * 5 + 0xe6546b64;
}

static __always_inline __u32 sw_hash_final(__u32 h)
{
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

/* A backend id from the service's maglev table, 0 when it has none. */
static __always_inline __u32 sw_maglev_backend(void *outer, __be16 rev_nat_index, __u32 hash)
{
	__u32 zero = 0, idx, size;
	__u32 *table;
	void *inner;

	inner = bpf_map_lookup_elem(outer, &rev_nat_index);
	if (!inner)
		return 0;
	table = bpf_map_lookup_elem(inner, &zero);
	if (!table)
		return 0;
	size = sw_maglev_table_size;
	if (size == 0)
		return 0;
	idx = hash % size;
	sw_barrier_var(idx);
	if (idx >= size)
		return 0;
	return table[idx];
}

#endif /* STATEWRIGHT_LB_SELECT_H */
