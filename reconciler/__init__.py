"""reconciler: drives a statedb table into any target through an Operations object."""
