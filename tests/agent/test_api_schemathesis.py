"""schemathesis against the live agent: the OpenAPI document is fetched from the agent's
unix socket and every operation is fuzzed through that same socket (not the in-process
application): no answer is a 5xx, and every answer conforms to the document (status codes,
content types, response schemas, ``Allow`` on 405; negative examples are refused with a
4xx). Left out is schemathesis's ``positive_data_acceptance`` (a schema-valid request must
be accepted): the handlers check what a schema cannot say (an address inside the pod
CIDRs and free, an endpoint id in 1..4095 or a known prefix, a label with a key) and answer
400 with the reason, which is the API's contract.

The change feed and the monitor stream are fuzzed with ``follow=0`` (with ``follow=1``
they stream until the client leaves; tests/agent/test_agent_api.py::
test_change_feed_streams_new_rows follows one).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import positive_data_acceptance

from tests.agent.conftest import AgentProc, running_agent
from tests.agent.unix_requests import unix_session

BASE_URL = "http://statewright-agent"
#: Examples per operation: enough to reach past the happy path of each (about 20
#: operations, a few minutes on the shared 2-core machine).
MAX_EXAMPLES = 40



@pytest.fixture(scope="module")
def fuzzed_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProc]:
    """A memory-maps agent of this module's own (the fuzzing creates and deletes
    endpoints and addresses)."""
    with running_agent(tmp_path_factory.mktemp("fuzz")) as a:
        yield a


@pytest.fixture(scope="module")
def agent_session(fuzzed_agent: AgentProc) -> Iterator[requests.Session]:
    """HTTP over the agent's unix socket."""
    session = unix_session(fuzzed_agent.socket)
    yield session
    session.close()


#: The change feed streams until the client leaves unless ``follow=0``: fuzzed with it.
FEED = "/tables/{name}/changes"
#: So does the monitor's stream of flows.
MONITOR = "/monitor"


def _operations(agent: AgentProc) -> list[schemathesis.APIOperation]:
    """The operations of the document the agent serves."""
    doc = agent.client.get("/openapi.json")
    schema = schemathesis.openapi.from_dict(doc)
    return [result.ok() for result in schema.get_all_operations()]


def _fuzz(op: schemathesis.APIOperation, mode: GenerationMode,
          session: requests.Session) -> None:
    """``MAX_EXAMPLES`` cases of ``op`` in ``mode``, each sent and checked."""
    fixed = {"query": {"follow": "0"}} if op.path in (FEED, MONITOR) else {}

    @given(case=op.as_strategy(generation_mode=mode, **fixed))
    # The generation filters negative cases and the shared machine is slow: the health
    # checks about generation speed and size would fail runs that found nothing.
    @settings(max_examples=MAX_EXAMPLES, deadline=10_000, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                     HealthCheck.data_too_large,
                                     HealthCheck.large_base_example])
    def run(case: schemathesis.Case) -> None:
        response = case.call_and_validate(base_url=BASE_URL, session=session, timeout=30,
                                          excluded_checks=[positive_data_acceptance])
        assert response.status_code < 500, response.text

    run()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
                         ids=lambda m: m.value)
def test_api_conforms_to_its_openapi_document(
    mode: GenerationMode, fuzzed_agent: AgentProc, agent_session: requests.Session
) -> None:
    operations = _operations(fuzzed_agent)
    labels = {op.label for op in operations}
    assert {"GET /health", "PUT /endpoint/{id}", "PATCH /endpoint/{id}", "POST /ipam",
            "DELETE /ipam/{ip}", "GET /tables/{name}", "GET /k8s", f"GET {FEED}"} <= labels
    failures: dict[str, str] = {}
    for op in operations:
        try:
            _fuzz(op, mode, agent_session)
        except Unsatisfiable:
            assert mode is GenerationMode.NEGATIVE, op.label  # nothing to negate
        except Exception as e:
            failures[op.label] = f"{type(e).__name__}: {e}"
    assert not failures, "\n\n".join(f"{k}:\n{v}" for k, v in failures.items())
    assert fuzzed_agent.proc.poll() is None, fuzzed_agent.logs()
    assert fuzzed_agent.client.get("/health")["pid"] == fuzzed_agent.proc.pid
