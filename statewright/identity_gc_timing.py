"""The default timing of the operator's identity garbage collection (``statewright
operator``, statewright/operator.py): in a module of its own so the command line can show
it without importing the Kubernetes client, which costs every ``statewright`` command
about 0.2 s of CPU."""

#: Seconds an identity stays unused before it is deleted.
DEFAULT_GRACE = 900.0
#: Seconds between collection passes.
DEFAULT_INTERVAL = 60.0
