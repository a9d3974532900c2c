// SPDX-License-Identifier: Apache-2.0
/* Statewright: the key and value types of every map the agent creates, gathered
 * so that `clang -g -target bpf` emits their BTF. `make setup` compiles this
 * file into build/btf_types.o (bpf/btf.py compiles it on first use when that
 * object is missing or older than the headers); bpf/btf.py loads the object's
 * .BTF section into the kernel and passes the BTF type ids when it creates a
 * map, so `bpftool map dump` prints keys and values as these structs.
 *
 * Nothing here is a program or a map: the one function below exists only so
 * that the compiler keeps the types (clang emits BTF for the types a function
 * or variable uses, and a global variable would add a data section, which the
 * kernel rejects in a BTF blob loaded on its own).
 *
 * A new map in bpf/catalog.py needs its key and value types here:
 * tests/bpf/test_btf.py checks that every catalogue type is found. The maglev
 * inner value (__u32[table size]) is added at run time, since the table size
 * is configurable. */
#include "include/lb.h"
#include "include/eps.h"
#include "include/ipcache.h"

/* One member per type; the member names do not matter. Scalar keys and values
 * (__u8, __u32, __be16) are kept by their typedef names. */
struct sw_btf_types {
	/* scalars used as keys or values */
	__u8 u8;
	__u32 u32;
	__be16 be16;
	/* load balancer (lb.h) */
	struct lb4_key lb4_key;
	struct lb6_key lb6_key;
	struct lb4_service lb4_service;
	struct lb6_service lb6_service;
	struct lb4_backend lb4_backend;
	struct lb6_backend lb6_backend;
	struct lb4_reverse_nat lb4_reverse_nat;
	struct lb6_reverse_nat lb6_reverse_nat;
	struct lb_affinity_match lb_affinity_match;
	struct lb4_affinity_key lb4_affinity_key;
	struct lb6_affinity_key lb6_affinity_key;
	struct lb_affinity_val lb_affinity_val;
	struct lb4_src_range_key lb4_src_range_key;
	struct lb6_src_range_key lb6_src_range_key;
	/* endpoints (eps.h) */
	struct endpoint_key endpoint_key;
	struct endpoint_info endpoint_info;
	/* ipcache (ipcache.h) */
	struct ipcache_key ipcache_key;
	struct remote_endpoint_info remote_endpoint_info;
};

/* Keeps struct sw_btf_types (and through it every type above) in the BTF. */
int sw_btf_types(struct sw_btf_types *types)
{
	return types != 0;
}
