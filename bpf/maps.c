// SPDX-License-Identifier: Apache-2.0
/* Statewright: instantiates every map declared in bpf/include so that the
 * compiled object's BTF describes all structs and maps. Built by the layout
 * test and by make setup (build/maps.o); bpf/btf.py gives its BTF to every map
 * it creates. Never loaded as a program. */
#define SW_DEFINE_MAPS
#define SW_DEFINE_POLICY_TEMPLATE
#include "include/lb.h"
#include "include/endpoints.h"
#include "include/ipcache.h"
#include "include/policy.h"
#include "include/ct.h"
#include "include/nat.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";
