"""Every exception class of the library packages subclasses `StatewrightError`, and the ones
for bad input subclass `InputError`, so callers can tell the project's errors from bugs and
sources can report bad input without swallowing bugs."""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil

import pytest

from statedb import InputError, StatewrightError

#: Packages whose exception classes must all be under the root.
PACKAGES = ("statedb", "reconciler", "bpf", "bpfops", "tables", "sources", "statewright", "policy")

#: Exception classes that mean bad input.
INPUT_ERRORS = {
    "sources.k8s_convert.ConversionError",
    "sources.manifests.ManifestError",
    "sources.state_file.StateFileError",
    "tables.l3n4.AddressError",
    "tables.lb_config.FlagError",
    "tables.lb_writer.FrontendConflictError",
    "tables.lb_writer.InvalidBackendError",
    "statewright.agent.config.ConfigError",
    "sources.k8s_client.K8sConfigError",
    "sources.k8s_kubeconfig.KubeconfigError",
    "tables.ipam.IPAMRequestError",
    "tables.endpoints.EndpointRequestError",
    "tables.identities.LabelError",
    "tables.cluster_identities.IdentityObjectError",
    "tables.nodes.NodeError",
    "tables.sysctls.SysctlNameError",
    "tables.remote_endpoints.EndpointObjectError",
    "tables.namespaces.NamespaceError",
    "sources.kvstore.config.KVStoreConfigError",
    "reconciler.status_index.UnknownStatusKindError",
    "policy.errors.PolicyError",
    "policy.errors.PolicyTraceError",
    "statewright.agent.json_schema.SchemaViolation",
    "statewright.observe.map_keys.KeyTextError",
    "statewright.observe.provenance.ExplainError",
}


def _exception_classes() -> dict[str, type[BaseException]]:
    out: dict[str, type[BaseException]] = {}
    for name in PACKAGES:
        pkg = importlib.import_module(name)
        modules = [pkg] + [
            importlib.import_module(info.name)
            for info in pkgutil.walk_packages(pkg.__path__, f"{name}.")
            if not info.name.endswith("__main__")  # running them is what they do
        ]
        for mod in modules:
            for cls_name, cls in inspect.getmembers(mod, inspect.isclass):
                if cls.__module__ == mod.__name__ and issubclass(cls, BaseException):
                    out[f"{mod.__name__}.{cls_name}"] = cls
    return out


CLASSES = _exception_classes()


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_exception_class_is_under_the_root(name: str) -> None:
    cls = CLASSES[name]
    assert issubclass(cls, StatewrightError)
    assert issubclass(cls, InputError) == (name in INPUT_ERRORS or cls is InputError)


def test_input_errors_are_known() -> None:
    assert set(CLASSES) >= INPUT_ERRORS


def test_input_error_str_and_pickle() -> None:
    err = InputError("port 0 is not allowed", obj="Service default/echo",
                     field="spec.ports[1].port")
    assert str(err) == "Service default/echo: spec.ports[1].port: port 0 is not allowed"
    assert str(InputError("bad", obj="x.yaml")) == "x.yaml: bad"
    assert str(InputError("bad")) == "bad"
    assert isinstance(err, ValueError)
    back = pickle.loads(pickle.dumps(err))
    assert (type(back), str(back), back.obj, back.field) == (
        InputError, str(err), err.obj, err.field)
