/* SPDX-License-Identifier: Apache-2.0 */
/* Statewright: the socket load balancer's own state, the reverse-translation
 * maps. When bpf/sock_lb.c rewrites a socket's destination from a service
 * address to a backend it records (socket cookie, backend) -> service here, so
 * recvmsg and getpeername can show the service address again. The LB maps it
 * reads are those of lb.h. */
#ifndef STATEWRIGHT_SOCK_LB_H
#define STATEWRIGHT_SOCK_LB_H

#include "common.h"

#define SW_SOCK_REVNAT_MAX_ENTRIES 65536

struct sw_sock_revnat4_key {
	__u64 cookie;    /* bpf_get_socket_cookie() of the translated socket */
	__be32 address;  /* backend address */
	__be16 port;     /* backend port */
	__u16 pad;
};

struct sw_sock_revnat4_val {
	__be32 address;       /* service address the socket asked for */
	__be16 port;          /* service port */
	__be16 rev_nat_index; /* service id; the entry is void once lb4_reverse_nat disagrees */
};

struct sw_sock_revnat6_key {
	__u64 cookie;
	union sw_v6addr address;
	__be16 port;
	__u16 pad;
	__u32 pad2;
};

struct sw_sock_revnat6_val {
	union sw_v6addr address;
	__be16 port;
	__be16 rev_nat_index;
};

#endif /* STATEWRIGHT_SOCK_LB_H */
