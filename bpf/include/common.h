/* SPDX-License-Identifier: Apache-2.0 */
/* Statewright: shared scalar types and map-type helpers for the map headers. */
#ifndef STATEWRIGHT_COMMON_H
#define STATEWRIGHT_COMMON_H

#include <linux/types.h>

/* A 16-byte IPv6 address (or an IPv4 address in its first four bytes). It is
 * byte-aligned so that it never introduces padding in the structs using it. */
union sw_v6addr {
	struct {
		__u32 p1;
		__u32 p2;
		__u32 p3;
		__u32 p4;
	};
	__u8 addr[16];
} __attribute__((packed));

/* Map creation flag: allocate hash/LPM elements on demand (BPF_F_NO_PREALLOC). */
#define SW_F_NO_PREALLOC 1
/* Hash maps are not preallocated, matching the datapath's default. */
#define SW_CONDITIONAL_PREALLOC SW_F_NO_PREALLOC

/* Address families used in the endpoint and ipcache keys. */
#define SW_FAMILY_IPV4 1
#define SW_FAMILY_IPV6 2

#endif /* STATEWRIGHT_COMMON_H */
